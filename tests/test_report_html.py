"""``fedforge report RUN``: every section present (a sentence where the run has
no data), the embedded numbers equal to the store's rows read apart with
sqlite3, no reference to the network, and every text escaped."""

from __future__ import annotations

import html
import json
import os
import platform
import shutil
import sqlite3
import statistics
from collections import Counter
from importlib import metadata
from itertools import accumulate
from pathlib import Path
from typing import Any

import plotly.offline
import pytest
import torch
import yaml
from tests.report_pages import HOSTILE_NAME, SECRET, Page, read_page

from fedforge.cli import main
from fedforge.config import Config
from fedforge.report.html import clients, report_html
from fedforge.store import RunStore
from fedforge.store.versions import add_version

SECTIONS = [
    "run", "progress", "time", "clients", "groups", "participation", "updates",
    "refused", "alerts", "privacy", "bytes", "versions", "setup",
]  # fmt: skip
HOSTILE_GROUP = "</script><img src=x onerror=alert(1)>"


def rows(run_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(run_dir / "store.sqlite") as conn:
        return conn.execute(sql).fetchall()


def report(run: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> Page:
    assert main(["report", str(run), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    return read_page(out)


def figure(page: Page, title: str) -> dict[str, Any]:
    found = [f for f in page.figures if f["layout"]["title"]["text"] == title]
    assert len(found) == 1, [f["layout"]["title"]["text"] for f in page.figures]
    return found[0]


def test_the_report_holds_the_stores_numbers(
    report_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = report_runs["robust"]
    page = report(run, tmp_path / "r.html", capsys)
    assert page.sections == SECTIONS
    d = page.data
    sql = (
        "SELECT round_idx, test_accuracy, test_loss, train_loss, bytes_up, bytes_down, "
        "seconds, float32_up, float32_down FROM rounds ORDER BY round_idx"
    )
    r = rows(run, sql)
    assert d["progress"]["round"] == [x[0] + 1 for x in r]
    assert d["progress"]["test_accuracy"] == [x[1] for x in r]
    assert d["progress"]["test_loss"] == [x[2] for x in r]
    assert d["progress"]["train_loss"] == [x[3] for x in r]
    assert figure(page, "Test accuracy")["data"][0]["y"] == [x[1] for x in r]
    assert d["time"]["cumulative_seconds"] == pytest.approx(list(accumulate(x[6] for x in r)))
    assert d["time"]["virtual_time"] is None
    assert d["bytes"]["bytes_up"] == [x[4] for x in r]
    assert d["bytes"]["bytes_down"] == [x[5] for x in r]
    assert d["bytes"]["ratio_up"] == pytest.approx([x[7] / x[4] for x in r])
    assert d["bytes"]["ratio_down"] == pytest.approx([x[8] / x[5] for x in r])

    # per-client accuracy: the last evaluated round, one value per client
    evals = rows(run, "SELECT round_idx, client_id, accuracy FROM client_eval")
    last = max(e[0] for e in evals)
    accs = {c: a for rr, c, a in evals if rr == last}
    got = d["clients"]
    assert got["round"] == last + 1
    assert dict(zip(got["client_id"], got["accuracy"], strict=True)) == accs
    assert got["summary"]["mean"] == pytest.approx(statistics.mean(accs.values()))
    assert got["summary"]["std"] == pytest.approx(statistics.pstdev(accs.values()))
    worst = sorted(accs, key=lambda c: (accs[c], c))
    assert [w["client_id"] for w in got["worst"]] == worst
    means = [statistics.mean(a for rr, _, a in evals if rr == k) for k in range(last + 1)]
    assert got["over_rounds"]["mean"] == pytest.approx(means)

    counts = Counter(c for (c,) in rows(run, "SELECT client_id FROM client_rounds"))
    part = d["participation"]
    assert dict(zip(part["client_id"], part["rounds"], strict=True)) == counts
    assert part["never"] == 6 - len(counts)
    assert [w["rounds_aggregated"] for w in got["worst"]] == [counts.get(c, 0) for c in worst]

    diag = rows(run, "SELECT round_idx, mean_cosine, norm_median, norm_max FROM diagnostics")
    assert d["updates"]["source"] == "diagnostics"
    assert d["updates"]["mean_cosine"] == [x[1] for x in diag]
    assert d["updates"]["norm_max"] == [x[3] for x in diag]

    refused = rows(run, "SELECT round_idx, client_id, reason FROM anomalies")
    assert refused and all(c is not None for _, c, _ in refused)  # the attackers' NaNs
    assert d["refused"]["refused"] == len(refused)
    by_client = Counter(c for _, c, _ in refused)
    got_clients = d["refused"]["by_client"]
    assert dict(zip(got_clients["client_id"], got_clients["count"], strict=True)) == by_client
    assert d["refused"]["by_reason"]["reason"] == ["delta holds non-finite values (NaN or inf)"]
    per_round = Counter(rr + 1 for rr, _, _ in refused)
    got_rounds = d["refused"]["per_round"]
    assert dict(zip(got_rounds["round"], got_rounds["count"], strict=True)) == per_round

    # per-group accuracy (client tags from a CSV): the group_eval rows
    groups = rows(run, "SELECT * FROM group_eval ORDER BY round_idx")
    assert {a for _, a, *_ in groups} == {"region"}
    got_groups = d["groups"]["attributes"]["region"]["groups"]
    assert sorted(got_groups) == sorted({g for _, _, g, *_ in groups}) == ["eu", "untagged", "us"]
    for name, got_group in got_groups.items():
        mine = [g for g in groups if g[2] == name]
        assert got_group["round"] == [g[0] + 1 for g in mine]
        assert got_group["accuracy"] == [g[3] for g in mine]
        assert got_group["num_examples"] == [g[5] for g in mine]
        assert got_group["clients"] == [g[6] for g in mine]
    assert [g[6] for g in groups if g[0] == groups[-1][0]] == [3, 1, 2]  # eu, untagged, us
    drawn = figure(page, "Accuracy per group: region")["data"]
    assert {t["name"]: t["y"] for t in drawn} == {n: g["accuracy"] for n, g in got_groups.items()}

    # the alerts fired: the alerts table
    fired = rows(run, "SELECT round_idx, rule, kind, message, outcome FROM alerts ORDER BY rowid")
    assert fired and {f[1] for f in fired} == {"refused_rate", "client_refused"}
    got_alerts = d["alerts"]
    assert got_alerts["rules"] == 3
    assert (
        list(
            zip(
                [r - 1 for r in got_alerts["round"]],
                got_alerts["rule"],
                got_alerts["kind"],
                got_alerts["message"],
                got_alerts["outcome"],
                strict=True,
            )
        )
        == fired
    )
    assert len(fired) > 1 and f"{len(fired)} alerts fired." in page.text["alerts"]
    assert all(f[3] in page.text["alerts"] for f in fired)

    # the sections without data say so
    assert "no privacy spent" in page.empty["privacy"]
    assert "no model versions" in page.empty["versions"]
    assert set(page.empty) == {"privacy", "versions"}
    # the config as the run wrote it, but the alert rule's secrets
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert SECRET in str(stored["alerts"]["rules"][2])
    stored["alerts"]["rules"][2].update(
        url="https://hooks.example.com:8443/…", command=["notify", "…"]
    )
    assert yaml.safe_load(d["setup"]["config_yaml"]) == stored
    assert d["setup"]["config_note"] is None
    assert SECRET not in (tmp_path / "r.html").read_text()
    assert d["setup"]["build"] == json.loads((run / "build.json").read_text())
    versions = d["setup"]["build"]["versions"]  # what the run started with
    assert versions["torch"] == metadata.version("torch")
    assert versions["fedforge"] == metadata.version("fedforge")
    assert versions["python"] == platform.python_version()
    assert d["setup"]["build"]["environment"]["cpus"] == os.cpu_count()
    assert "recorded no software versions" not in page.text["setup"]
    (config_json,) = rows(run, "SELECT config_json FROM runs")[0]
    assert d["run"]["client_fraction"] == json.loads(config_json)["client_fraction"]


def test_a_dp_run_reports_epsilon_against_its_budget(
    report_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = report_runs["dp"]
    page = report(run, tmp_path / "dp.html", capsys)
    assert page.sections == SECTIONS
    spent = rows(run, "SELECT round_idx, epsilon, delta FROM privacy ORDER BY 1")
    (config_json,) = rows(run, "SELECT config_json FROM runs")[0]
    budget = json.loads(config_json)["privacy"]["target_epsilon"]
    priv = page.data["privacy"]
    assert priv["round"] == [x[0] + 1 for x in spent] and priv["epsilon"] == [x[1] for x in spent]
    assert priv["budget"] == budget == 3.0
    traces = figure(page, "Epsilon spent")["data"]
    assert traces[1]["y"] == [budget, budget] and traces[0]["y"] == [x[1] for x in spent]
    assert page.data["run"]["epsilon"] == spent[-1][1]
    assert set(page.empty) == {"clients", "groups", "refused", "alerts", "versions"}
    assert "evaluation.clients was off" in page.empty["clients"]
    assert page.empty["alerts"] == "No alerts fired (0 rules watched)."


def test_the_page_is_offline_and_escapes_every_text(
    report_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run name and group names holding markup, a virtual_time column and a model
    version, on a copy of the run: all drawn, none of the markup taken as markup."""
    run = tmp_path / "runs" / report_runs["robust"].name
    shutil.copytree(report_runs["robust"], run)
    groups = [
        (r, "region", name, acc, 1.0, 10, 2)
        for r in range(2)
        for name, acc in (("north", 0.5 + r / 10), (HOSTILE_GROUP, 0.25))
    ]
    with sqlite3.connect(run / "store.sqlite") as conn:
        conn.execute("DELETE FROM group_eval")
        conn.executemany("INSERT INTO group_eval VALUES (?, ?, ?, ?, ?, ?, ?)", groups)
        conn.execute("ALTER TABLE rounds ADD COLUMN virtual_time REAL")
        conn.execute("UPDATE rounds SET virtual_time = 2.5 * (round_idx + 1)")
    with RunStore.open(run) as store:
        add_version(store, torch.zeros(3), 1, metrics={"accuracy": 0.5})
    out = tmp_path / "page.html"
    page = report(run, out, capsys)
    text = out.read_text()

    assert all(s.get("src") is None for s in page.scripts)  # plotly.js inline, nothing fetched
    assert not page.links
    assert len([s for s in page.scripts if s.get("type") is None]) == 2  # plotly.js, loader
    assert text.count(plotly.offline.get_plotlyjs()[:300]) == 1
    assert "img" not in page.tags and HOSTILE_NAME not in text
    assert html.escape(HOSTILE_NAME) in text and HOSTILE_NAME in page.text["run"]
    assert page.data["run"]["name"] == HOSTILE_NAME  # the JSON gives it back as it was

    region = page.data["groups"]["attributes"]["region"]["groups"]
    assert region[HOSTILE_GROUP]["accuracy"] == [0.25, 0.25]
    assert region["north"]["accuracy"] == [0.5, 0.6]
    names = [t["name"] for t in figure(page, "Accuracy per group: region")["data"]]
    assert sorted(names) == sorted([html.escape(HOSTILE_GROUP), "north"])
    assert page.data["time"]["virtual_time"] == [2.5 * (k + 1) for k in range(4)]
    assert figure(page, "Virtual time")["data"][0]["y"] == [2.5, 5.0, 7.5, 10.0]
    (version,) = page.data["versions"]["versions"]
    assert (version["version_id"], version["round"], version["status"]) == (1, 2, "candidate")
    assert set(page.empty) == {"privacy"}


def test_without_diagnostics_the_norms_come_from_the_clients_rows(
    report_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / report_runs["robust"].name
    shutil.copytree(report_runs["robust"], run)
    with sqlite3.connect(run / "store.sqlite") as conn:
        conn.execute("DROP TABLE diagnostics")
    with RunStore.open(run, read_only=True) as store:
        (tmp_path / "n.html").write_text(report_html(store))
    page = read_page(tmp_path / "n.html")
    norms: dict[int, list[float]] = {}
    for r, norm in rows(run, "SELECT round_idx, update_norm FROM client_rounds"):
        norms.setdefault(r + 1, []).append(norm)
    got = page.data["updates"]
    assert got["source"] == "client_rounds" and got["mean_cosine"] is None
    assert got["round"] == sorted(norms)
    assert got["norm_median"] == pytest.approx([statistics.median(norms[r]) for r in got["round"]])
    assert got["norm_max"] == [max(norms[r]) for r in got["round"]]
    assert "no cosine" in page.text["updates"]
    assert [f["layout"]["title"]["text"] for f in page.figures].count("Mean pairwise cosine") == 0


def test_a_run_without_rounds_says_so_in_every_section(tmp_path: Path) -> None:
    with RunStore.create(tmp_path, Config(name="empty")) as store:
        out = tmp_path / "empty.html"
        out.write_text(report_html(store))
    page = read_page(out)
    assert page.sections == SECTIONS
    assert set(page.empty) == set(SECTIONS) - {"run", "setup"}
    assert not page.figures


def test_many_clients_are_binned(
    report_runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(clients, "PER_CLIENT", 3)
    run = report_runs["robust"]
    with RunStore.open(run, read_only=True) as store:
        page = report_html(store)
    out = tmp_path / "binned.html"
    out.write_text(page)
    d = read_page(out).data
    evals = rows(run, "SELECT round_idx, accuracy FROM client_eval")
    last = max(e[0] for e in evals)
    assert d["clients"]["accuracy"] is None
    assert sum(d["clients"]["bins"]["counts"]) == len([e for e in evals if e[0] == last])
    counts = Counter(c for (c,) in rows(run, "SELECT client_id FROM client_rounds"))
    assert sum(d["participation"]["bins"]["counts"]) == len(counts)


def test_reasons_are_grouped_by_their_words() -> None:
    a = "update norm 12.5 is an outlier (robust z = 4.2 > 3.5; cohort median norm 1e-3)"
    b = "update norm 7 is an outlier (robust z = 9.0 > 3.5; cohort median norm 2.25)"
    assert clients.reason_kind(a) == clients.reason_kind(b)
    assert (
        clients.reason_kind(a)
        == "update norm # is an outlier (robust z = # > #; cohort median norm #)"
    )
    assert clients.reason_kind("'float32' tensor of 2f + 3") == "'float32' tensor of 2f + #"


def test_an_unknown_run_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "nosuch", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedforge: error: no run matches 'nosuch'") and "\n" not in err


def test_a_config_this_version_cannot_rebuild_is_shown_as_stored(
    report_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key of a newer fedforge in the stored config: the report and compare are
    still written, the config shown as stored (the secrets still cut) with a
    sentence saying why, the settings read from it by name."""
    run = tmp_path / "runs" / report_runs["robust"].name
    shutil.copytree(report_runs["robust"], run)
    (config_json,) = rows(run, "SELECT config_json FROM runs")[0]
    newer = {**json.loads(config_json), "from_the_future": {"knob": 3}}
    with sqlite3.connect(run / "store.sqlite") as conn:
        conn.execute("UPDATE runs SET config_json = ?", (json.dumps(newer),))
    page = report(run, tmp_path / "newer.html", capsys)
    assert page.sections == SECTIONS
    setup = page.data["setup"]
    shown = yaml.safe_load(setup["config_yaml"])
    assert shown["from_the_future"] == {"knob": 3}
    assert shown["alerts"]["rules"][2]["command"] == ["notify", "…"]
    assert "cannot rebuild the run's config" in setup["config_note"]
    assert "from_the_future" in setup["config_note"] and setup["config_note"] in page.text["setup"]
    assert page.data["run"]["algorithm"] == newer["algorithm"]
    assert page.data["participation"]["num_clients"] == newer["num_clients"] == 6
    assert SECRET not in (tmp_path / "newer.html").read_text()
    out = tmp_path / "c.html"
    assert main(["compare", str(run), str(report_runs["dp"]), "-o", str(out)]) == 0
    assert read_page(out).data["summary"]["runs"][0]["local_epochs"] == newer["local_epochs"]

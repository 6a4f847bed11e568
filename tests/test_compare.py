"""``fedforge compare RUN RUN ...``: every run's curves overlaid, its summary row
equal to its store read apart with sqlite3; runs named one by one, by a glob
pattern (a sweep's points), or by a folder of runs; unknown ones refused in one
line."""

from __future__ import annotations

import json
import sqlite3
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.report_pages import HOSTILE_NAME, SECRET, read_page

from fedforge.cli import main
from fedforge.report.progress import format_bytes, percent
from fedforge.store.runs_dir import resolve_runs

SWEEP = {
    "name": "swp",
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 4,
    "client_fraction": 1.0,
    "batch_size": 20,
    "lr": 0.01,
    "rounds": 2,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


def expected(run: Path) -> dict[str, Any]:
    """A run's summary row, computed from its database alone."""
    with sqlite3.connect(run / "store.sqlite") as conn:
        rounds = conn.execute(
            "SELECT round_idx, test_accuracy, bytes_up + bytes_down FROM rounds ORDER BY 1"
        ).fetchall()
        cfg_json, summary_json = conn.execute(
            "SELECT config_json, summary_json FROM runs"
        ).fetchone()
        tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_master")}
        spent = (
            conn.execute("SELECT epsilon FROM privacy ORDER BY round_idx").fetchall()
            if "privacy" in tables
            else []
        )
    cfg, summary = json.loads(cfg_json), json.loads(summary_json)
    evaluated = [(acc, r) for r, acc, _ in rounds if acc is not None]
    best = max(evaluated, key=lambda e: (e[0], -e[1]))
    return {
        "run_id": run.name,
        "algorithm": cfg["algorithm"],
        "client_fraction": cfg["client_fraction"],
        "local_epochs": cfg["local_epochs"],
        "batch_size": cfg["batch_size"],
        "rounds": len(rounds),
        "best_accuracy": best[0],
        "rounds_to_best": best[1] + 1,
        "final_accuracy": evaluated[-1][0],
        "total_bytes": sum(b for _, _, b in rounds),
        "wall_seconds": summary["wall_seconds"],
        "epsilon": spent[-1][0] if spent else None,
    }


def test_two_runs_overlaid_with_their_summaries(
    report_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [report_runs["robust"], report_runs["dp"]]
    out = tmp_path / "c.html"
    assert main(["compare", *map(str, runs), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} (2 runs)"
    page = read_page(out)
    assert page.sections == ["summary", "accuracy", "loss", "time", "bytes", "privacy"]
    assert SECRET not in out.read_text()  # the robust run's alert rule holds it
    for got, run in zip(page.data["summary"]["runs"], runs, strict=True):
        want = expected(run)
        assert {k: got[k] for k in want} == want
        row = page.text["summary"]
        assert percent(want["final_accuracy"]) in row and format_bytes(want["total_bytes"]) in row
    assert page.data["summary"]["runs"][0]["name"] == HOSTILE_NAME
    assert HOSTILE_NAME in page.text["summary"]  # as text: no script but plotly's and the loader
    assert len([s for s in page.scripts if s.get("type") is None]) == 2
    for section, column in (("accuracy", "test_accuracy"), ("loss", "test_loss")):
        series = page.data[section]
        assert [s["run_id"] for s in series] == [r.name for r in runs]
        for s, run in zip(series, runs, strict=True):
            with sqlite3.connect(run / "store.sqlite") as conn:
                want = conn.execute(f"SELECT {column} FROM rounds ORDER BY round_idx").fetchall()
            assert s[column] == [w for (w,) in want]
    # cumulative wall seconds, and float32 bytes over bytes sent each way per round
    names = [r.name for r in runs]
    assert [s["run_id"] for s in page.data["time"]] == names
    assert [s["run_id"] for s in page.data["bytes"]] == names
    for t, b, run in zip(page.data["time"], page.data["bytes"], runs, strict=True):
        with sqlite3.connect(run / "store.sqlite") as conn:
            r = conn.execute(
                "SELECT seconds, float32_up, bytes_up, float32_down, bytes_down FROM rounds "
                "ORDER BY round_idx"
            ).fetchall()
        assert t["cumulative_seconds"] == pytest.approx(list(accumulate(x[0] for x in r)))
        assert b["ratio_up"] == pytest.approx([x[1] / x[2] for x in r])
        assert b["ratio_down"] == pytest.approx([x[3] / x[4] for x in r])
    titles = {f["layout"]["title"]["text"]: f["data"] for f in page.figures}
    wall = titles["Wall time, cumulative"]
    assert [t["y"] for t in wall] == [s["cumulative_seconds"] for s in page.data["time"]]
    up = titles["Compression ratio, up (float32 bytes / bytes sent)"]
    assert [t["y"] for t in up] == [s["ratio_up"] for s in page.data["bytes"]]
    assert len(titles["Compression ratio, down (float32 bytes / bytes sent)"]) == 2
    accuracy = [f for f in page.figures if f["layout"]["title"]["text"] == "Test accuracy"][0]
    assert len(accuracy["data"]) == 2  # both runs drawn
    epsilon = [f for f in page.figures if f["layout"]["title"]["text"] == "Epsilon spent"][0]
    assert [t["name"] for t in epsilon["data"]] == [runs[1].name]  # the DP run alone
    assert not page.empty


def test_a_sweeps_runs_by_pattern_or_folder(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    one_thread: None,
) -> None:
    config = tmp_path / "swp.yaml"
    runs_dir = tmp_path / "sweep-runs"
    config.write_text(yaml.safe_dump({**SWEEP, "runs_dir": str(runs_dir)}))
    assert main(["sweep", str(config), "--grid", "local_epochs=1,2", "-q"]) == 0
    points = sorted(runs_dir.iterdir())
    assert len(points) == 2
    capsys.readouterr()
    by_pattern, by_folder = tmp_path / "p.html", tmp_path / "f.html"
    assert main(["compare", "swp-*", "--runs-dir", str(runs_dir), "-o", str(by_pattern)]) == 0
    assert main(["compare", str(runs_dir), "-o", str(by_folder)]) == 0
    for out in (by_pattern, by_folder):
        got = read_page(out).data["summary"]["runs"]
        assert [g["run_id"] for g in got] == [p.name for p in points]
        assert [g["local_epochs"] for g in got] == [1, 2]
        assert got == [{**g, **expected(p)} for g, p in zip(got, points, strict=True)]
    assert "no DP run" in read_page(by_folder).empty["privacy"]
    # a run named twice (by its name and by the pattern) is compared once
    twice = tmp_path / "t.html"
    argv = ["compare", str(points[0]), "swp-*", "--runs-dir", str(runs_dir), "-o", str(twice)]
    assert main(argv) == 0
    assert len(read_page(twice).data["summary"]["runs"]) == 2
    # a pattern that finds each run twice, relative (from here) and absolute (in
    # --runs-dir): each compared once
    monkeypatch.chdir(runs_dir)
    found = resolve_runs(runs_dir, ["*swp*"])
    assert sorted(p.resolve() for p in found) == [p.resolve() for p in points]
    assert main(["compare", "*swp*", "--runs-dir", str(runs_dir), "-o", str(twice)]) == 0
    assert [g["run_id"] for g in read_page(twice).data["summary"]["runs"]] == [
        p.name for p in points
    ]


@pytest.mark.parametrize(
    "ref, words",
    [
        ("nosuch", "no run matches 'nosuch' in"),
        ("zz-*", "no run matches the pattern 'zz-*'"),
        ("", "empty run reference"),
    ],
)
def test_unknown_runs_are_refused_in_one_line(
    report_runs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    ref: str,
    words: str,
) -> None:
    runs_dir = report_runs["dp"].parent
    out = tmp_path / "never.html"
    assert main(["compare", "rep-dp", ref, "--runs-dir", str(runs_dir), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedforge: error: ") and words in err and "\n" not in err
    assert not out.exists()


def test_a_folder_without_runs_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty"), "-o", str(tmp_path / "x.html")]) == 2
    assert "holds no run" in capsys.readouterr().err

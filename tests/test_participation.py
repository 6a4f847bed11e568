"""Participation (evaluation/participation.py): Jain's index, Gini and the
Lorenz curve against hand-worked values; the fairness floor's guarantee over
many rounds of a real run (every client asked in every window of P rounds),
which the uniform draw does not give; and the figures of a run as its summary,
its end-of-run lines and ``fedforge report`` show them, recomputed here from the
store's ``cohorts`` and ``client_rounds``."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.report_pages import read_page

import fedforge
from fedforge.config import from_dict
from fedforge.core.errors import ConfigError
from fedforge.evaluation.participation import gini, jain_index, lorenz, participation
from fedforge.report.html.run_report import write_report
from fedforge.server.summary import format_summary
from fedforge.store import RunStore

BASE: dict[str, Any] = {
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 12,
    "client_fraction": 0.25,
    "batch_size": None,
    "target_accuracy": None,
    "dtype": "float64",
    "engine": "serial",
    "evaluation": {"every": 100},  # evaluated at the end only: quick
    "checkpoint_every": 0,
}


def test_jain_gini_and_the_lorenz_curve_by_hand() -> None:
    """Counts 3, 1, 0, 0: Jain (4)^2 / (4 x 10) = 0.4; Gini: the ordered pairs'
    absolute differences sum to 20, over 2 n^2 mean = 32: 0.625. All equal: 1
    and 0; one client holding everything: 1/n and (n - 1)/n."""
    assert jain_index([3, 1, 0, 0]) == pytest.approx(0.4)
    assert gini([3, 1, 0, 0]) == pytest.approx(0.625)
    assert gini([0, 3, 0, 1]) == pytest.approx(0.625)  # order does not matter
    assert jain_index([2, 2, 2]) == 1.0 and gini([2, 2, 2]) == 0.0
    assert jain_index([5, 0, 0, 0, 0]) == pytest.approx(0.2)
    assert gini([5, 0, 0, 0, 0]) == pytest.approx(0.8)
    assert gini([]) == 0.0 and gini([0, 0]) == 0.0
    curve = lorenz([3, 1, 0, 0])
    assert curve == {"clients": [0.0, 0.25, 0.5, 0.75, 1.0], "share": [0.0, 0.0, 0.0, 0.25, 1.0]}
    many = lorenz(list(range(1000)), points=10)
    assert len(many["clients"]) == 11 and many["share"][-1] == pytest.approx(1.0)


def test_the_participation_figures_by_hand() -> None:
    """Five clients: asked 3, 1, 0, 2, 0 rounds (2 and 4 never), first asked in
    rounds 0, 4, -, 2, -; the clock at round ends 1.5, 4, -, 10 s. Waits: 0, 2, 4
    rounds (median 2), 0, 4, 10 s (median 4). Jain of the asked: 36 / (5 x 14)."""
    got = participation(
        5, {0: 3, 1: 1, 3: 2}, {0: 2, 3: 1}, {0: 0, 1: 4, 3: 2}, {0: 1.5, 1: 4.0, 3: 10.0}
    )
    assert got["never_asked"] == 2 and got["never_asked_ids"] == "2, 4"
    assert got["never_used"] == 3 and got["asked_total"] == 6 and got["used_total"] == 3
    assert got["jain_asked"] == pytest.approx(36 / 70)
    assert got["jain_used"] == pytest.approx(9 / (5 * 5))
    assert got["first_asked_median_rounds"] == 2 and got["first_asked_max_rounds"] == 4
    assert got["first_asked_median_s"] == 4.0 and got["first_asked_max_s"] == 10.0
    rounds_only = participation(5, {0: 3}, {}, {0: 0})
    assert rounds_only["first_asked_median_s"] is None


def _cohorts(run_dir: Path) -> list[tuple[int, int, int]]:
    with RunStore.open(run_dir) as store:
        return [tuple(r) for r in store.read_rows("cohorts")]


def _uncovered(cohorts: list[tuple[int, int, int]], n: int, period: int, rounds: int) -> list[int]:
    """The first rounds of the windows of ``period`` rounds in which some client
    was not asked (a cohort belongs to the round it was drawn in)."""
    return [
        r
        for r in range(rounds - period + 1)
        if {c for _, c, drawn in cohorts if r <= drawn < r + period} != set(range(n))
    ]


@pytest.mark.parametrize(
    ("extra", "period", "rounds"),
    [
        ({"client_fraction": 0.25}, 4, 16),  # N = m P: a round robin
        ({"client_fraction": 0.34}, 4, 16),  # 12 < 4 x 4: slack for the uniform part
        ({"client_fraction": 0.5, "communication": {"upload_every": 2}}, 4, 12),  # 2 cohorts
    ],
)
def test_the_fairness_floor_asks_every_client_in_every_window_of_p_rounds(
    tmp_path: Path, extra: dict[str, Any], period: int, rounds: int
) -> None:
    """A real run, stragglers' uploads dropped: every window of P rounds asked all
    twelve clients; the uniform draw of the first run misses some in some window."""
    cfg = {
        **BASE,
        "rounds": rounds,
        "local_epochs": 2,
        "stragglers": {"fraction": 0.34, "drop": True},
        **extra,
        "runs_dir": str(tmp_path / "floor"),
        "selection": {"policy": "fairness_floor"},
        "plugin_options": {"fairness_floor": {"period": period}},
    }
    floor = fedforge.run(from_dict(cfg))
    assert _uncovered(_cohorts(floor.run_dir), 12, period, rounds) == []
    if extra["client_fraction"] != 0.25:
        return
    uniform = {**cfg, "selection": {"policy": "uniform"}, "plugin_options": {}}
    uniform["runs_dir"] = str(tmp_path / "uniform")
    assert _uncovered(_cohorts(fedforge.run(from_dict(uniform)).run_dir), 12, period, rounds)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            {"plugin_options": {"fairness_floor": {"period": 3}}},
            "period = 3 cannot ask all 12 clients: 3 cohort(s) of 3 ask at most 9; use period >= 4",
        ),
        (
            {
                "plugin_options": {"fairness_floor": {"period": 5}},
                "communication": {"upload_every": 2},
            },
            "period = 5 must be a multiple of communication.upload_every = 2",
        ),
    ],
)
def test_an_infeasible_floor_is_refused_in_one_line(
    tmp_path: Path, extra: dict[str, Any], said: str
) -> None:
    cfg = {**BASE, "runs_dir": str(tmp_path), "selection": {"policy": "fairness_floor"}, **extra}
    with pytest.raises(ConfigError) as err:
        fedforge.build(from_dict(cfg))
    assert "\n" not in str(err.value) and said in str(err.value)


def test_a_runs_summary_and_report_show_its_participation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """power_of_choice on 12 clients for 6 rounds: the summary's figures are those
    recomputed from the store's cohorts (asked) and client_rounds (used); the
    end-of-run lines say them; the report shows them with the Lorenz curve and,
    given a virtual clock (a virtual_time column here), the wait in seconds."""
    cfg = {
        **BASE,
        "rounds": 6,
        "runs_dir": str(tmp_path / "runs"),
        "selection": {"policy": "power_of_choice"},
    }
    result = fedforge.run(from_dict(cfg))
    cohorts = _cohorts(result.run_dir)
    with RunStore.open(result.run_dir) as store:
        used = store.participation()
    asked = Counter(c for _, c, _ in cohorts)
    first = {c: min(d for _, k, d in cohorts if k == c) for c in asked}
    x = np.array([asked.get(c, 0) for c in range(12)], dtype=float)
    p = result.summary["participation"]
    assert p["asked_total"] == len(cohorts) == 6 * 3
    assert p["jain_asked"] == pytest.approx(x.sum() ** 2 / (12 * (x * x).sum()))
    pairs = np.abs(x[:, None] - x[None, :]).sum()
    assert p["gini_asked"] == pytest.approx(pairs / (2 * 12 * 12 * x.mean()))
    assert p["never_asked"] == 12 - len(asked) and p["used_total"] == sum(used.values())
    assert p["first_asked_max_rounds"] == max(first.values())
    assert p["first_asked_median_rounds"] == np.median(list(first.values()))
    lines = format_summary(result.summary)
    assert f"{12 - p['never_asked']} of 12 clients asked; Jain {p['jain_asked']:.3f}" in lines

    with sqlite3.connect(result.run_dir / "store.sqlite") as conn:  # a clock: 2 s a round
        conn.execute("ALTER TABLE rounds ADD COLUMN virtual_time REAL")
        conn.execute("UPDATE rounds SET virtual_time = 2.0 * (round_idx + 1)")
    page = read_page(write_report(result.run_dir, tmp_path / "r.html"))
    d = page.data["participation"]
    assert d["asked_recorded"] and d["asked"] == x.tolist()
    stats = d["stats"]
    for key in ("jain_asked", "gini_asked", "never_asked", "jain_used", "first_asked_max_rounds"):
        assert stats[key] == pytest.approx(p[key]), key
    waits = sorted(2.0 * r for r in first.values())  # the clock at the end of round r - 1
    assert stats["first_asked_median_s"] == pytest.approx(np.median(waits))
    assert stats["first_asked_max_s"] == pytest.approx(waits[-1])
    titles = [f["layout"]["title"]["text"] for f in page.figures]
    assert "Lorenz curve of participation" in titles and "Clients by rounds asked" in titles
    assert f"Jain's index {p['jain_asked']:.3f}" in page.text["participation"]
    assert "s of virtual time (median)" in page.text["participation"]

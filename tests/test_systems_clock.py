"""The virtual clock in the simulator's synchronous rounds: a round of four
clients whose profiles are chosen by hand (a CSV), its clients' times from the
real bytes and examples, the deadline, over-selection, failures; virtual time
to target in the summary; a rerun and a resume identical."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import fedforge
from fedforge.config import Config, override
from fedforge.server.hooks import RoundEnd, RoundHook, RoundInfo
from fedforge.systems import ClientProfile, write_profiles
from fedforge.systems.clock import close_round

INF = math.inf


# ------------------------------------------------------------------- the round's end


def test_every_asked_client_arrives_and_the_round_ends_at_the_last() -> None:
    end = close_round({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, dict.fromkeys(range(4), INF), 4, None)
    assert end.taken == [0, 1, 2, 3] and end.duration_s == 4.0 and end.dropped == {}


def test_the_deadline_drops_the_late_and_ends_the_round_short_of_its_target() -> None:
    end = close_round({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, dict.fromkeys(range(4), INF), 4, 2.5)
    assert end.taken == [0, 1] and end.duration_s == 2.5 and sorted(end.dropped) == [2, 3]


def test_over_selection_takes_the_first_arrivals_and_ends_at_the_kth() -> None:
    totals = {0: 3.0, 1: 1.0, 2: 2.0, 3: 2.0}  # a tie: the lower id first
    end = close_round(totals, dict.fromkeys(range(4), INF), 2, 10.0)
    assert end.taken == [1, 2] and end.duration_s == 2.0 and sorted(end.dropped) == [0, 3]


def test_a_client_offline_before_it_finishes_drops_out() -> None:
    end = close_round({0: 1.0, 1: 2.0}, {0: 0.5, 1: INF}, 2, None)
    assert end.taken == [1] and 0 in end.dropped
    assert end.duration_s == 2.0  # no deadline: the last client it waits for


# ------------------------------------------------------------------ a hand-worked run

# four clients: 0 and 1 fast, 2 slow to upload, 3 slow to compute
PROFILES = [
    ClientProfile(0, samples_per_s=1000.0, download_bps=1e5, upload_bps=1e5, latency_s=0.01),
    ClientProfile(1, samples_per_s=500.0, download_bps=2e5, upload_bps=5e4, latency_s=0.02),
    ClientProfile(2, samples_per_s=2000.0, download_bps=1e5, upload_bps=1e3, latency_s=0.0),
    ClientProfile(3, samples_per_s=2.0, download_bps=1e6, upload_bps=1e6, latency_s=0.1),
]


def _cfg(tmp: Path, **extra: Any) -> Config:
    path = tmp / "profiles.csv"
    write_profiles(path, PROFILES)
    base = {
        "dataset": "synthetic", "model": "logreg", "num_clients": 4, "client_fraction": 1.0,
        "rounds": 2, "target_accuracy": None, "dtype": "float64", "engine": "serial",
        "runs_dir": str(tmp / "runs"), "batch_size": 10, "lr": 0.01, "local_epochs": 2,
        "checkpoint_every": 0, "seed": 5, "systems.profiles": str(path),
    }  # fmt: skip
    return override(Config(), {**base, **extra})


def _rows(run_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        return db.execute(sql).fetchall()


def _by_hand(run_dir: Path, round_idx: int) -> dict[int, float]:
    """Each uploading client's total seconds, from the bytes and examples the
    store recorded for it and its profile: the clock's formula written out."""
    got = _rows(
        run_dir,
        "SELECT client_id, num_examples, bytes_up, bytes_down FROM client_rounds "
        f"WHERE round_idx = {round_idx}",
    )
    out = {}
    for c, n, up, down in got:
        p = PROFILES[c]
        out[c] = (
            p.latency_s + down / p.download_bps + 2 * n / p.samples_per_s
            + p.latency_s + up / p.upload_bps
        )  # fmt: skip
    return out


def test_a_deadline_round_worked_by_hand(tmp_path: Path) -> None:
    # without a deadline every client arrives: the round lasts as long as the slowest
    free = fedforge.run(_cfg(tmp_path, rounds=1))
    assert free.run_dir is not None
    hand = _by_hand(free.run_dir, 0)
    assert sorted(hand) == [0, 1, 2, 3]
    (clock,) = _rows(free.run_dir, "SELECT start_s, duration_s, end_s, asked FROM round_clock")
    assert clock[0] == 0.0 and clock[1] == pytest.approx(max(hand.values()), rel=1e-12)
    assert clock[3] == 4
    times = _rows(free.run_dir, "SELECT client_id, total_s, arrived FROM client_times")
    assert {c: t for c, t, _ in times} == pytest.approx(hand, rel=1e-12)
    # a deadline between the fast two and the slow two: 2 and 3 drop out
    fast = sorted(hand.values())
    deadline = (fast[1] + fast[2]) / 2
    assert sorted(hand, key=hand.__getitem__)[:2] == [0, 1]  # the profiles' intent
    late = fedforge.run(_cfg(tmp_path, rounds=1, **{"systems.deadline_s": deadline}))
    assert late.run_dir is not None
    used = _rows(late.run_dir, "SELECT client_id FROM client_rounds ORDER BY client_id")
    assert [c for (c,) in used] == [0, 1]
    (dur,) = _rows(late.run_dir, "SELECT duration_s FROM round_clock")
    assert dur[0] == deadline
    arrived = _rows(late.run_dir, "SELECT client_id, arrived FROM client_times ORDER BY client_id")
    assert arrived == [(0, 1), (1, 1), (2, 0), (3, 0)]
    assert late.summary["virtual_seconds"] == deadline
    # the dropouts are not refusals: no anomaly recorded
    assert _rows(late.run_dir, "SELECT COUNT(*) FROM anomalies") == [(0,)]


def test_over_selection_asks_more_and_takes_the_first_k(tmp_path: Path) -> None:
    # C = 0.5 of 4: K = 2; f = 1: ceil(2 * 2) = 4 asked, the first two to arrive taken
    cfg = _cfg(tmp_path, rounds=1, client_fraction=0.5, **{"systems.over_selection": 1.0})
    result = fedforge.run(cfg)
    assert result.run_dir is not None
    asked = _rows(result.run_dir, "SELECT client_id, total_s FROM client_times")
    assert len(asked) == 4
    first = sorted(asked, key=lambda r: (r[1], r[0]))[:2]
    used = _rows(result.run_dir, "SELECT client_id FROM client_rounds ORDER BY client_id")
    assert [c for (c,) in used] == sorted(c for c, _ in first)
    (dur,) = _rows(result.run_dir, "SELECT duration_s FROM round_clock")
    assert dur[0] == first[1][1]


def test_a_compressed_upload_shows_in_time(tmp_path: Path) -> None:
    dense = fedforge.run(_cfg(tmp_path, rounds=1))
    small = fedforge.run(_cfg(tmp_path, rounds=1, **{"communication.uplink": "int8"}))
    assert dense.run_dir is not None and small.run_dir is not None
    sql = "SELECT upload_s FROM client_times WHERE client_id = 2"
    (d,), (s,) = _rows(dense.run_dir, sql)[0], _rows(small.run_dir, sql)[0]
    ((up,),) = _rows(small.run_dir, "SELECT bytes_up FROM client_rounds WHERE client_id = 2")
    assert s == pytest.approx(up / PROFILES[2].upload_bps, rel=1e-12)  # no latency
    assert s < d / 3  # int8 values: about a quarter of float64's... bytes, and of time


def test_failures_are_drawn_and_failed_clients_do_not_train(tmp_path: Path) -> None:
    sure = [
        ClientProfile(p.client_id, p.samples_per_s, p.download_bps, p.upload_bps, 0.0, 1.0)
        if p.client_id == 1
        else p
        for p in PROFILES
    ]
    path = tmp_path / "fail.csv"
    write_profiles(path, sure)
    result = fedforge.run(_cfg(tmp_path, rounds=2, **{"systems.profiles": str(path)}))
    assert result.run_dir is not None
    used = _rows(result.run_dir, "SELECT DISTINCT client_id FROM client_rounds ORDER BY 1")
    assert [c for (c,) in used] == [0, 2, 3]
    failed = _rows(result.run_dir, "SELECT compute_s, total_s, arrived FROM client_times "
                   "WHERE client_id = 1")  # fmt: skip
    assert failed == [(None, None, 0)] * 2


class Durations(RoundHook):
    """The durations a round hands its hooks, and the history's after it."""

    name = "durations"

    def __init__(self) -> None:
        self.seen: list[dict[int, float]] = []
        self.history: list[dict[int, Any]] = []

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        self.seen.append(dict(end.durations))
        view = info.state.selection.view(info.exp.client_sizes())
        self.history.append({c: view[c].last_duration_s for c in range(4)})


def test_target_time_and_the_history_durations(tmp_path: Path) -> None:
    hook = Durations()
    cfg = _cfg(tmp_path, rounds=2, target_accuracy=0.01, **{"evaluation.every": 1})
    result = fedforge.run(cfg, hooks=[hook])
    assert result.run_dir is not None
    (dur,) = _rows(result.run_dir, "SELECT duration_s FROM round_clock")
    # reached at the first evaluation: rounds to target 1, its time round 1's
    assert result.summary["rounds_to_target"] == 1.0
    assert result.summary["virtual_seconds_to_target"] == dur[0]
    times = dict(_rows(result.run_dir, "SELECT client_id, total_s FROM client_times"))
    assert hook.seen == [times] and hook.history == [times]


# ------------------------------------------------------------- rerun and resume


class FailAt(RoundHook):
    name = "fail_at"

    def round_start(self, info: RoundInfo) -> None:
        if info.round_idx == 3:
            raise RuntimeError("stopped on purpose")


def _record(run_dir: Path) -> list[Any]:
    return [
        _rows(run_dir, "SELECT * FROM round_clock ORDER BY round_idx"),
        _rows(run_dir, "SELECT * FROM client_times ORDER BY round_idx, client_id"),
        _rows(run_dir, "SELECT round_idx, train_loss, test_accuracy, bytes_up FROM rounds"),
        _rows(run_dir, "SELECT * FROM client_rounds ORDER BY round_idx, client_id"),
    ]


def test_rerun_and_resume_are_identical_with_the_clock_on(tmp_path: Path) -> None:
    drawn = {
        "systems.profiles": None, "systems.draw": True, "systems.mean_online_s": 2.0,
        "systems.mean_offline_s": 2.0, "systems.failure_prob": 0.2, "num_clients": 8,
        "client_fraction": 0.5, "systems.over_selection": 0.5, "systems.compute_median": 500.0,
        "rounds": 6, "checkpoint_every": 2,
    }  # fmt: skip
    one = fedforge.run(_cfg(tmp_path, **drawn))
    two = fedforge.run(_cfg(tmp_path, **drawn))
    assert one.run_dir is not None and two.run_dir is not None
    first = _record(one.run_dir)
    assert first == _record(two.run_dir)
    assert len({r[4] for r in first[0]}) > 1  # availability changed the pool between rounds
    with pytest.raises(RuntimeError, match="on purpose"):
        fedforge.run(_cfg(tmp_path, name="broken", **drawn), hooks=[FailAt()])
    (broken,) = (tmp_path / "runs").glob("*-broken-*")
    resumed = fedforge.resume(broken)
    assert _record(broken) == first
    assert torch_equal(resumed.params, one.params)
    assert resumed.summary["virtual_seconds"] == one.summary["virtual_seconds"]


def torch_equal(a: Any, b: Any) -> bool:
    return bool((a == b).all())


# ------------------------------------------------------------------- the report


def test_the_report_and_compare_show_the_population_and_time_to_target(tmp_path: Path) -> None:
    from fedforge.report.html.compare import compare_html
    from fedforge.report.html.run_report import report_html
    from fedforge.store.runstore import RunStore
    from fedforge.systems.summary import POPULATION_FILE

    result = fedforge.run(_cfg(tmp_path, rounds=1, target_accuracy=0.01, **{"evaluation.every": 1}))
    assert result.run_dir is not None
    with RunStore.open(result.run_dir, read_only=True) as store:
        page = report_html(store)
    assert "Population: 4 clients" in page and "to the target" in page
    compared = compare_html([result.run_dir])
    assert "virtual to target" in compared
    # the file is a run folder's, which may come from anyone: its text is escaped
    pop = result.run_dir / POPULATION_FILE
    pop.write_text(json.dumps({**json.loads(pop.read_text()), "clients": "<img src=x>"}))
    with RunStore.open(result.run_dir, read_only=True) as store:
        page = report_html(store)
    assert "<img src=x>" not in page and "Population: &lt;img src=x&gt; clients" in page


def test_stragglers_fewer_epochs_count_in_compute_time(tmp_path: Path) -> None:
    from fedforge.server.stragglers import straggler_epochs

    cfg = _cfg(
        tmp_path, rounds=1, algorithm="fedprox", local_epochs=4, **{"stragglers.fraction": 0.5}
    )
    result = fedforge.run(cfg)
    assert result.run_dir is not None
    slow = straggler_epochs(range(4), 0.5, 4, cfg.seed, 0)
    assert slow  # some clients straggle, each with fewer epochs
    sizes = dict(_rows(result.run_dir, "SELECT client_id, num_examples FROM client_rounds"))
    for c, compute in _rows(result.run_dir, "SELECT client_id, compute_s FROM client_times"):
        epochs = slow.get(c, 4)
        assert compute == pytest.approx(epochs * sizes[c] / PROFILES[c].samples_per_s, rel=1e-12)


def test_only_the_clients_online_at_the_start_are_asked(tmp_path: Path) -> None:
    # client 3 is never online; client 2 goes offline 0.001 s into every 10 s
    trace = tmp_path / "trace.csv"
    rows = ["client_id,start_s,end_s", "0,0,10", "1,0,10", "2,0,0.001"]
    trace.write_text("\n".join(rows) + "\n")
    result = fedforge.run(_cfg(tmp_path, rounds=2, **{"systems.trace": str(trace)}))
    assert result.run_dir is not None
    asked = _rows(result.run_dir, "SELECT round_idx, client_id, arrived FROM client_times")
    assert asked == [(0, 0, 1), (0, 1, 1), (0, 2, 0), (1, 0, 1), (1, 1, 1)]
    clock = _rows(result.run_dir, "SELECT round_idx, online, asked, arrived FROM round_clock")
    assert clock == [(0, 3, 3, 2), (1, 2, 2, 2)]


def test_the_end_of_run_lines_say_the_virtual_time() -> None:
    from fedforge.report.facts import run_facts

    facts = dict(run_facts({"virtual_seconds": 5400.0, "virtual_seconds_to_target": 90.0}))
    assert facts["virtual"] == "1.50 h on the virtual clock, 1.5 min to the target"
    assert "virtual" not in dict(run_facts({}))

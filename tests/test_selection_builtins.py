"""The built-in selection policies (selection/): power_of_choice, oort,
fairness_floor, deadline_aware, each against a choice worked by hand on a small
population whose history is written out here; their options and the privacy
rules refused in one line; the same seed asking the same cohorts, and a run
stopped and resumed asking the uninterrupted run's."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.conftest import RunStopped

import fedforge
from fedforge.config import from_dict
from fedforge.core.errors import ConfigError
from fedforge.selection.deadline import DeadlineAware
from fedforge.selection.fairness_floor import FairnessFloor
from fedforge.selection.history import History
from fedforge.selection.named import SelectionRound
from fedforge.selection.oort import Oort
from fedforge.selection.options import OortOptions
from fedforge.selection.power_of_choice import PowerOfChoice
from fedforge.store import RunStore

BUILT_IN = ("power_of_choice", "oort", "fairness_floor", "deadline_aware")
BASE: dict[str, Any] = {
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 12,
    "client_fraction": 0.25,
    "batch_size": None,
    "rounds": 8,
    "target_accuracy": None,
    "dtype": "float64",
    "engine": "serial",
}


def ask(
    rows: dict[int, dict[str, Any]], sizes: list[int], size: int, round_idx: int = 0, seed: int = 0
) -> SelectionRound:
    """A round asking ``size`` of every client, the server knowing ``rows``."""
    view = History(rows).view(sizes)
    among = list(range(len(sizes)))
    return SelectionRound(round_idx, among, size, view, np.random.default_rng(seed))


def test_power_of_choice_asks_the_highest_losses_of_its_candidates_unknown_first() -> None:
    """Six clients; 0 and 3 hold no examples, so the 4 candidates drawn by n_k are
    1, 2, 4, 5 whatever the draw; 0 and 3's large losses do not count. Known
    losses 1: 0.5, 4: 2.0, 5: 1.0; 2 never taken (+inf). Two asked: 2 and 4;
    three: 2, 4, 5. d = None is twice the cohort: 4 for two."""
    rows = {
        0: {"last_loss": 9.0},
        1: {"last_loss": 0.5},
        2: {"asked": 1, "dropped": 1},
        3: {"last_loss": 8.0},
        4: {"last_loss": 2.0},
        5: {"last_loss": 1.0},
    }
    sizes = [0, 10, 20, 0, 30, 40]
    for seed in range(10):
        assert PowerOfChoice(4).select(ask(rows, sizes, 2, seed=seed))[:2] == [2, 4]
        assert PowerOfChoice(None).select(ask(rows, sizes, 2, seed=seed)) == [2, 4]
        assert PowerOfChoice(4).select(ask(rows, sizes, 3, seed=seed)) == [2, 4, 5]
    # every client a candidate (d = N): the two largest losses of all
    rows[2] = {"last_loss": 0.1}
    assert sorted(PowerOfChoice(6).select(ask(rows, sizes, 2))) == [0, 3]
    # d = the cohort: the n_k-weighted draw itself; the candidate count never below it
    assert len(PowerOfChoice(1).select(ask(rows, sizes, 3))) == 3


def test_power_of_choice_asks_a_client_refused_and_never_taken_last() -> None:
    """Four clients, every one a candidate (d = N): 0 never asked (+inf), 1 asked
    and refused twice with no loss known (-inf), 2 and 3 losses 2.0 and 1.0; a
    dropped client (no upload, nothing refused) stays unknown: +inf."""
    rows = {1: {"asked": 2, "refused": 2}, 2: {"last_loss": 2.0}, 3: {"last_loss": 1.0}}
    sizes = [10, 10, 10, 10]
    for size, want in ((1, [0]), (2, [0, 2]), (3, [0, 2, 3]), (4, [0, 2, 3, 1])):
        assert PowerOfChoice(4).select(ask(rows, sizes, size)) == want
    rows[0] = {"asked": 3, "dropped": 3}
    assert PowerOfChoice(4).select(ask(rows, sizes, 4)) == [0, 2, 3, 1]
    # a refused client whose loss was once known ranks by that loss
    rows[1] = {"asked": 3, "refused": 2, "used": 1, "last_loss": 5.0}
    assert PowerOfChoice(4).select(ask(rows, sizes, 2)) == [0, 1]


def oort_rows() -> tuple[dict[int, dict[str, Any]], list[int]]:
    """Three clients heard from (losses, last taken rounds, durations), two not."""
    rows = {
        0: {"last_loss": 2.0, "last_used": 4, "last_duration_s": 5.0},
        1: {"last_loss": 0.5, "last_used": 8, "last_duration_s": 20.0},
        2: {"last_loss": 1.0, "last_used": 0, "last_duration_s": 10.0},
        4: {"asked": 1, "dropped": 1},
    }
    return rows, [10, 20, 40, 5, 5]


def test_oort_scores_utility_plus_staleness_times_the_speed_penalty() -> None:
    """Round 10 (index 9), T = 10 s, alpha = 2: U = n * loss = 20, 10, 40, clipped
    at their 95th percentile (rank 0.95 x 2 = 1.9, the lower held value: 20), so
    20, 10, 20, scaled by the largest to 1, 0.5, 1; staleness sqrt(0.1 ln 10 / L) with L the round
    (from 1) last taken 5, 9, 1; client 1 took 20 s > T: times (10/20)^2."""
    rows, sizes = oort_rows()
    policy = Oort(OortOptions(preferred_duration_s=10.0))
    got = policy.scores(ask(rows, sizes, 2, round_idx=9))
    bonus = [math.sqrt(0.1 * math.log(10) / last) for last in (5, 9, 1)]
    want = {0: 1.0 + bonus[0], 1: (0.5 + bonus[1]) * 0.25, 2: 1.0 + bonus[2]}
    assert got.keys() == want.keys()
    for c, score in want.items():
        assert got[c] == pytest.approx(score, rel=1e-12)
    # T from the durations: their median (percentile 50) is 10 s, the same scores
    from_durations = Oort(OortOptions(duration_percentile=50.0))
    assert from_durations.preferred_duration(ask(rows, sizes, 2, round_idx=9)) == 10.0
    assert from_durations.scores(ask(rows, sizes, 2, round_idx=9)) == pytest.approx(want)


def test_a_client_claiming_a_huge_loss_is_scored_as_the_clipped_top() -> None:
    """Twenty clients of 10 examples, losses 1.0 .. 2.0; client 0 claims 1e6, client 1
    a loss that makes n * loss infinite, client 2 a negative one. U is clipped at
    its 95th percentile (the lower held value): the liar's utility term is the
    top honest client's, 1, the honest clients keep theirs (n * loss over it), the
    non-finite and negative claims count 0."""
    losses = [1e6, 1e308, -5.0] + [1.0 + k / 16 for k in range(17)]
    rows = {c: {"last_loss": x, "last_used": 0} for c, x in enumerate(losses)}
    sizes = [10] * 20
    policy = Oort(OortOptions(preferred_duration_s=10.0, staleness=0.0))
    got = policy.scores(ask(rows, sizes, 2, round_idx=0))
    # ranked U: 0, 0, 10 .. 20 (17 honest), 1e7; rank 0.95 x 19 = 18.05: the 19th, 20
    cap = 20.0
    assert got[0] == 1.0 and got[1] == 0.0 and got[2] == 0.0
    for c in range(3, 20):
        assert got[c] == pytest.approx(min(10 * losses[c], cap) / cap, rel=1e-12)
    assert min(got[c] for c in range(3, 20)) == 0.5  # 10 / 20: the liar flattened none


def test_oort_exploits_above_the_cut_off_and_explores_the_unheard() -> None:
    """Scores 2: 1.48, 0: 0.71, 1: 0.10 (above). No exploration: two asked are the
    two above 0.95 x the second score (2 and 0), one asked is 2 alone. Epsilon 2/3
    of three: one exploited (2) and both never heard from (3, 4). Epsilon 1 of
    four: only two unheard, so the exploited fill: 0, 2, 3, 4."""
    rows, sizes = oort_rows()
    greedy = Oort(OortOptions(preferred_duration_s=10.0, exploration=0.0, exploration_min=0.0))
    for seed in range(10):
        assert sorted(greedy.select(ask(rows, sizes, 2, 9, seed))) == [0, 2]
        assert greedy.select(ask(rows, sizes, 1, 9, seed)) == [2]
        third = Oort(OortOptions(preferred_duration_s=10.0, exploration=2 / 3, exploration_decay=1))
        assert sorted(third.select(ask(rows, sizes, 3, 9, seed))) == [2, 3, 4]
        everyone = Oort(OortOptions(preferred_duration_s=10.0, exploration=1.0))
        assert sorted(everyone.select(ask(rows, sizes, 4, 9, seed))) == [0, 2, 3, 4]


def test_oort_stops_exploring_a_client_refused_and_never_taken() -> None:
    """Clients 0-2 heard from as in oort_rows; 3 never asked; 4 asked twice and
    refused twice, 5 refused once, never taken. Epsilon 1 of a cohort of two: the
    explorable are 3 and 5 (4 has reached explore_refusals = 2), so every draw asks
    them. Asking all six: the explored and explorable (five) first, 4 last. With
    explore_refusals = 3, client 4 is explored again."""
    rows, _ = oort_rows()
    rows[4] = {"asked": 2, "refused": 2}
    rows[5] = {"asked": 1, "refused": 1}
    sizes = [10, 20, 40, 5, 5, 5]
    everyone = Oort(OortOptions(preferred_duration_s=10.0, exploration=1.0))
    for seed in range(10):
        assert sorted(everyone.select(ask(rows, sizes, 2, 9, seed))) == [3, 5]
        picked = everyone.select(ask(rows, sizes, 6, 9, seed))
        assert sorted(picked[:5]) == [0, 1, 2, 3, 5] and picked[5] == 4
    lenient = Oort(OortOptions(preferred_duration_s=10.0, exploration=1.0, explore_refusals=3))
    seen = {c for seed in range(20) for c in lenient.select(ask(rows, sizes, 2, 9, seed))}
    assert seen == {3, 4, 5}
    # several shunned: fewest refusals first, then the lower id; a client once
    # taken (its loss since hidden) is explored whatever its refusals
    rows[3] = {"asked": 3, "refused": 3}
    rows[5] = {"asked": 2, "refused": 2}
    rows[6] = {"asked": 4, "refused": 3, "used": 1}
    sizes.append(5)
    picked = everyone.select(ask(rows, sizes, 7, 9))
    assert sorted(picked[:4]) == [0, 1, 2, 6] and picked[4:] == [4, 5, 3]
    # asking among a subset: ids index the history, not positions in ``among``
    view = History(rows).view(sizes)
    among = [3, 4, 5, 1]
    sub = SelectionRound(9, among, 3, view, np.random.default_rng(0))
    assert everyone.select(sub) == [1, 4, 5]


def test_oort_blacklists_the_most_asked_up_to_its_share() -> None:
    """Ten clients all heard from, asked 0, 1, ..., 9 times. blacklist_rounds 5:
    clients 6-9 were asked more often; a share of 0.3 leaves out at most three,
    the most asked (9, 8, 7), so 6 may still be asked. A cohort of eight leaves
    room to leave out two only (9, 8). Without the option nobody is left out."""
    rows = {c: {"last_loss": 1.0, "last_used": 0, "asked": c} for c in range(10)}
    sizes = [10] * 10
    on = Oort(OortOptions(preferred_duration_s=10.0, exploration=0.0, exploration_min=0.0,
                          blacklist_rounds=5))  # fmt: skip
    assert on.blacklisted(ask(rows, sizes, 5)) == {7, 8, 9}
    assert on.blacklisted(ask(rows, sizes, 8)) == {8, 9}
    for seed in range(10):
        assert not {7, 8, 9} & set(on.select(ask(rows, sizes, 5, seed=seed)))
        assert len(set(on.select(ask(rows, sizes, 8, seed=seed)))) == 8
    off = Oort(OortOptions(preferred_duration_s=10.0))
    assert off.blacklisted(ask(rows, sizes, 5)) == set()
    seen = {c for seed in range(30) for c in off.select(ask(rows, sizes, 5, seed=seed))}
    assert {7, 8, 9} <= seen


def test_oort_explores_faster_clients_more_often() -> None:
    """Two unheard clients measured at 1 s and 3 s, one explored a round: the fast
    one with probability (1/1) / (1/1 + 1/3) = 3/4 (2000 draws, 5 standard errors)."""
    rows = {0: {"last_duration_s": 1.0}, 1: {"last_duration_s": 3.0}}
    policy = Oort(OortOptions(exploration=1.0))
    fast = sum(policy.select(ask(rows, [5, 5], 1, seed=s)) == [0] for s in range(2000))
    assert abs(fast / 2000 - 0.75) <= 5 * math.sqrt(0.75 * 0.25 / 2000)


def test_oort_decays_exploration_and_paces_the_preferred_duration() -> None:
    policy = Oort(OortOptions())
    assert policy.exploration_at(0) == 0.9
    assert policy.exploration_at(10) == pytest.approx(0.9 * 0.98**10)
    assert policy.exploration_at(100) == 0.3  # 0.9 x 0.98^100 = 0.12: the floor
    # window 2 at round index 4: utility 10 + 1 taken in rounds 2-3 against 10.5 in
    # rounds 0-1: within 10%, stalled: percentile 30 + 20 = 50 of 1..5 s is 3 s
    rows: dict[int, dict[str, Any]] = {
        0: {"last_loss": 1.0, "last_used": 3, "last_duration_s": 1.0},
        1: {"last_loss": 1.05, "last_used": 1, "last_duration_s": 2.0},
        2: {"last_loss": 1.0, "last_used": 3, "last_duration_s": 3.0},
        3: {"last_duration_s": 4.0},
        4: {"last_duration_s": 5.0},
    }
    sizes = [10, 10, 1, 1, 1]
    paced = Oort(OortOptions(pacer_window=2, pacer_delta=20.0))
    assert paced.stalled(ask(rows, sizes, 1, round_idx=4))
    assert paced.preferred_duration(ask(rows, sizes, 1, round_idx=4)) == 3.0
    assert not paced.stalled(ask(rows, sizes, 1, round_idx=3))  # fewer than two windows
    rows[1]["last_loss"] = 2.0  # 20 before, 11 now: utility moved, T stays at 30%
    assert not paced.stalled(ask(rows, sizes, 1, round_idx=4))
    assert paced.preferred_duration(ask(rows, sizes, 1, round_idx=4)) == pytest.approx(2.2)


def test_fairness_floor_asks_the_overdue_first_and_the_rest_uniformly() -> None:
    """P = 3, cohorts of 2, round index 5. Six clients asked last in rounds 3, 3,
    4, 4, 2, 2: 4 and 5 are due now; nobody else may be asked. Five clients
    asked last in 3, 4, 4, 2, 3: deadlines 6, 7, 7, 5, 6; f = max(1 - 0, 3 - 2,
    5 - 4) = 1: client 3, then one of the other four, each of them sometimes."""
    floor = FairnessFloor(3, 1)
    last = [3, 3, 4, 4, 2, 2]
    rows = {c: {"asked": 1, "last_asked": r} for c, r in enumerate(last)}
    for seed in range(10):
        assert sorted(floor.select(ask(rows, [5] * 6, 2, 5, seed))) == [4, 5]
    last = [3, 4, 4, 2, 3]
    rows = {c: {"asked": 1, "last_asked": r} for c, r in enumerate(last)}
    assert floor.forced(ask(rows, [5] * 5, 2, 5)) == 1
    seconds = set()
    for seed in range(40):
        got = floor.select(ask(rows, [5] * 5, 2, 5, seed))
        assert got[0] == 3 and len(set(got)) == 2
        seconds.add(got[1])
    assert seconds == {0, 1, 2, 4}


def test_deadline_aware_explores_then_fits_then_the_fastest_slow() -> None:
    """Durations 1, 5, 2, -, 9, - s against a 3 s deadline: 0 and 2 fit, 3 and 5
    are unmeasured, 1 and 4 are too slow (1 the faster). Four asked, half
    exploring: 3, 5, 0, 2. Five, none exploring: 0, 2 fit, 3, 5, then 1. The
    median known (3.5 s) as the deadline: the same."""
    durations = [1.0, 5.0, 2.0, None, 9.0, None]
    rows = {c: {"last_duration_s": t} for c, t in enumerate(durations) if t is not None}
    sizes = [5] * 6
    for seed in range(10):
        got = DeadlineAware(3.0, 0.5).select(ask(rows, sizes, 4, seed=seed))
        assert sorted(got[:2]) == [3, 5] and sorted(got) == [0, 2, 3, 5]
        assert sorted(DeadlineAware(3.0, 0.0).select(ask(rows, sizes, 5, seed=seed))) == [
            0,
            1,
            2,
            3,
            5,
        ]
        got = DeadlineAware(None, 0.0).select(ask(rows, sizes, 3, seed=seed))
        assert sorted(got[:2]) == [0, 2] and got[2] in (3, 5)
    assert DeadlineAware(None, 0).deadline(ask(rows, sizes, 1)) == 3.5


def _cfg(tmp_path: Path, **extra: Any) -> fedforge.Config:
    return from_dict({**BASE, "runs_dir": str(tmp_path / "runs"), **extra})


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_built_ins_are_refused_with_dp_in_one_line(tmp_path: Path, name: str) -> None:
    dp = {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0}
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, selection={"policy": name}, privacy=dp)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"selection.policy = '{name}' with privacy.dp")


class HistorySeen(fedforge.RoundHook):
    """Counts, at the run's end, the clients used and the losses the history holds."""

    name = "history_seen"
    used = losses = 0

    def round_end(self, info: Any, end: Any) -> None:
        rows = info.state.selection.rows.values()
        self.used = sum(r.get("used", 0) for r in rows)
        self.losses = sum(r.get("last_loss") is not None for r in rows)


@pytest.mark.parametrize(
    ("name", "refused"),
    [
        ("power_of_choice", True),
        ("oort", True),
        ("fairness_floor", False),
        ("deadline_aware", False),
    ],
)
def test_under_secure_aggregation_a_policy_reading_losses_is_refused(
    tmp_path: Path, name: str, refused: bool
) -> None:
    """The server sees no client's own loss under SecAgg (every history row's
    last_loss stays None): a policy ranking by losses is refused in one line;
    one reading counts and durations runs, and its history holds no loss."""
    secagg = {"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}}
    cfg = _cfg(tmp_path, selection={"policy": name}, **secagg, rounds=3)
    if refused:
        with pytest.raises(ConfigError) as err:
            fedforge.build(cfg)
        line = str(err.value)
        assert "\n" not in line
        assert f"selection.policy = '{name}' ranks clients by the training losses" in line
        assert "which privacy.secagg keeps from the server" in line
        return
    seen = HistorySeen()
    assert fedforge.run(cfg, hooks=[seen]).summary["rounds_done"] == 3
    assert seen.used > 0 and seen.losses == 0


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"power_of_choice": {"d": 13}}, "power_of_choice.d = 13 must be at most num_clients"),
        ({"power_of_choice": {"d": 0}}, "'plugin_options.power_of_choice.d' = 0"),
        ({"oort": {"exploration": 0.2}}, "exploration_min = 0.3 must be at most exploration"),
        ({"oort": {"penalty": -1}}, "'plugin_options.oort.penalty' = -1"),
        ({"oort": {"blacklist_rounds": 0}}, "'plugin_options.oort.blacklist_rounds' = 0"),
        ({"oort": {"explore_refusals": 0}}, "'plugin_options.oort.explore_refusals' = 0"),
        ({"deadline_aware": {"deadline_s": 0}}, "'plugin_options.deadline_aware.deadline_s' = 0"),
    ],
)
def test_bad_options_are_refused_in_one_line(
    tmp_path: Path, options: dict[str, Any], said: str
) -> None:
    (name,) = options
    with pytest.raises(ConfigError) as err:
        fedforge.build(_cfg(tmp_path, selection={"policy": name}, plugin_options=options))
    assert "\n" not in str(err.value) and said in str(err.value)


def _cohorts(run_dir: Path) -> list[tuple[int, int, int]]:
    with RunStore.open(run_dir) as store:
        return [tuple(r) for r in store.read_rows("cohorts")]


@pytest.mark.parametrize("name", ["oort", "fairness_floor"])  # those keeping most in history
def test_a_stopped_and_resumed_run_asks_the_uninterrupted_runs_cohorts(
    tmp_path: Path, run_stopped: RunStopped, name: str
) -> None:
    """A run stopped by SIGTERM in round 4 (checkpointed at round 2), resumed: the
    cohorts are an uninterrupted run's of the same seed (the rounds re-run after
    the checkpoint too): a policy keeps no state of its own, the history comes
    back from the checkpoint and the generator from (seed, round)."""
    options = {"fairness_floor": {"period": 4}} if name == "fairness_floor" else {}
    extra = {"selection": {"policy": name}, "plugin_options": options, "seed": 5}
    reference = _cohorts(fedforge.run(_cfg(tmp_path / "a", **extra)).run_dir)
    assert len({c for _, c, _ in reference}) > 3  # not one fixed cohort
    stopped = run_stopped(_cfg(tmp_path / "c", checkpoint_every=2, **extra), None, 3)
    assert stopped.stopped is not None
    fedforge.resume(stopped.run_dir)
    assert _cohorts(stopped.run_dir) == reference

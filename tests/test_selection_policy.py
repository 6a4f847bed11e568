"""The cohort selection policy (selection/named.py): the config names it, the
built-in ``uniform`` asks the cohorts McMahan et al.'s uniform draw asks, a
policy reads what the server knows of each client (selection/history.py) as
the run store records it, a wrong answer and a non-uniform policy under DP
are refused in one line."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

import fedforge
from fedforge.config import from_dict
from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.selection.history import ClientHistory, History
from fedforge.selection.sampling import sample_cohort
from fedforge.server.cohort import sample
from fedforge.server.experiment import build
from fedforge.store import RunStore

BASE: dict[str, Any] = {
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 12,
    "client_fraction": 0.25,
    "batch_size": 10,
    "rounds": 4,
    "target_accuracy": None,
    "dtype": "float64",
    "engine": "serial",
}


def _cfg(tmp_path: Path, **extra: Any) -> fedforge.Config:
    return from_dict({**BASE, "runs_dir": str(tmp_path / "runs"), **extra})


def _cohorts(run_dir: Path) -> dict[int, list[int]]:
    with RunStore.open(run_dir) as store:
        rows = store.client_rounds()
    out: dict[int, list[int]] = {}
    for c in rows:
        out.setdefault(c.round_idx, []).append(c.client_id)
    return {r: sorted(ids) for r, ids in sorted(out.items())}


def test_the_default_policy_asks_the_cohorts_of_the_uniform_draw(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, seed=3)
    assert cfg.selection.policy == "uniform"
    result = fedforge.run(cfg)
    want = {r: sample_cohort(12, 0.25, 3, r) for r in range(4)}
    assert _cohorts(result.run_dir) == want  # every update taken: the cohort's rows
    exp = build(cfg)
    for seed, among in ((0, None), (5, [1, 2, 4, 7, 8, 11]), (9, [3, 6])):
        exp.cfg = dataclasses.replace(cfg, seed=seed)
        for r in range(6):
            got = sample(exp, r, among, History())
            assert got == sample_cohort(12, 0.25, seed, r, False, among)


class Recording:
    """Uniform draws, keeping what it was told each round."""

    def __init__(self) -> None:
        self.told: dict[int, tuple[list[int], dict[int, ClientHistory]]] = {}

    def select(self, round: fedforge.SelectionRound) -> list[int]:
        picked = sorted(
            int(round.among[i])
            for i in round.rng.choice(len(round.among), round.size, replace=False)
        )
        self.told[round.round_idx] = (picked, {c: round.history[c] for c in round.among})
        return picked


@pytest.fixture
def recording() -> Any:
    policy = Recording()
    fedforge.register_selection("recording", lambda context: policy)
    yield policy
    registry.unregister("selection", "recording")


def test_a_policy_reads_what_the_run_store_records_of_each_client(
    tmp_path: Path, recording: Recording
) -> None:
    """Attackers' NaN updates refused, stragglers' work dropped: before each round
    the policy is told, of every client, the rounds it was asked (the first and the
    last), used, refused and dropped and its last taken loss, as replayed here from
    the store; the store's ``cohorts`` holds each round's asked clients."""
    cfg = _cfg(
        tmp_path,
        rounds=5,
        local_epochs=2,
        selection={"policy": "recording"},
        robust={"attack": "nan_inf", "attack_fraction": 0.25, "min_clients": 1},
        stragglers={"fraction": 0.34, "drop": True},
    )
    result = fedforge.run(cfg)
    sizes = build(cfg).data.partition.sizes().tolist()
    with RunStore.open(result.run_dir) as store:
        rows, anomalies = store.client_rounds(), store.anomalies()
    refused = [(a.round_idx, a.client_id) for a in anomalies if a.client_id is not None]
    assert refused and len(rows) < sum(len(p) for p, _ in recording.told.values())
    for t, (_, told) in recording.told.items():
        for c, got in told.items():
            asked = [r for r, (p, _) in recording.told.items() if r < t and c in p]
            used = [x for x in rows if x.client_id == c and x.round_idx < t]
            no = [r for r, k in refused if k == c and r < t]
            dropped = [r for r in asked if r not in no and r not in {x.round_idx for x in used}]
            want = ClientHistory(
                c,
                sizes[c],
                len(asked),
                max(asked, default=None),
                len(used),
                max((x.round_idx for x in used), default=None),
                used[-1].train_loss if used else None,
                len(no),
                len(dropped),
                first_asked=min(asked, default=None),
            )
            assert got == want, (t, c)
    told_dropped = sum(h.dropped for h in recording.told[4][1].values())
    assert told_dropped > 0
    with RunStore.open(result.run_dir) as store:  # every cohort, dropped clients too
        cohorts = store.read_rows("cohorts")
    assert cohorts == [(r, c, r) for r, (p, _) in sorted(recording.told.items()) for c in p]


def test_the_history_is_plain_json_and_comes_back_exactly() -> None:
    history = History()
    history.round_done(0, 0, [1, 3, 4], [1, 3], {1: 0.1 + 0.2, 3: math.nan}, [3])
    history.round_done(2, 3, [1, 2], [2], {2: 1 / 3}, [])
    back = History.from_state(json.loads(json.dumps(history.state_dict())))
    sizes = [5, 6, 7, 8, 9]
    assert dict(back.view(sizes)) == dict(history.view(sizes))
    view = back.view(sizes)
    assert view[1] == ClientHistory(1, 6, 2, 2, 1, 0, 0.1 + 0.2, 0, 1, first_asked=0)
    assert view[3] == ClientHistory(3, 8, 1, 0, 1, 0, None, 1, 0, first_asked=0)  # loss: NaN
    assert view[2].first_asked == 2
    assert view[2].last_loss == 1 / 3 and view[0] == ClientHistory(0, 5)
    assert view[4].dropped == 1 and len(view) == 5 and 5 not in view


@pytest.mark.parametrize(
    ("answer", "said"),
    [([0, 0, 1], "chose [0, 0, 1]"), ([0, 1], "chose [0, 1]"), ([0, 1, 99], "chose [0, 1, 99]")],
)
def test_a_policy_answer_that_is_no_cohort_is_refused_in_one_line(
    tmp_path: Path, answer: list[int], said: str
) -> None:
    class Wrong:
        def select(self, round: fedforge.SelectionRound) -> list[int]:
            return answer

    fedforge.register_selection("wrong", lambda context: Wrong())
    try:
        with pytest.raises(ConfigError) as err:
            fedforge.run(_cfg(tmp_path, selection={"policy": "wrong"}))
    finally:
        registry.unregister("selection", "wrong")
    line = str(err.value)
    assert "\n" not in line and said in line
    assert "selection.policy 'wrong'" in line and "3 distinct ids among the 12" in line


@pytest.mark.parametrize(
    ("privacy", "uses"),
    [
        ({"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0}, "privacy.dp = 'central'"),
        ({"dp": "local", "noise_multiplier": 1.0, "clip_norm": 1.0}, "privacy.dp = 'local'"),
        ({"sampling": "poisson"}, "privacy.sampling = 'poisson'"),
    ],
)
def test_a_policy_other_than_uniform_is_refused_with_dp(
    tmp_path: Path, recording: Recording, privacy: dict[str, Any], uses: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, selection={"policy": "recording"}, privacy=privacy)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"selection.policy = 'recording' with {uses}: ")
    _cfg(tmp_path, privacy=privacy)  # the uniform draw: allowed


def test_an_unregistered_policy_is_refused_naming_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, selection={"policy": "nope"})
    line = str(err.value)
    assert "\n" not in line and "selection.policy" in line and "'nope'" in line
    assert "uniform" in line


def test_a_deployments_over_selection_asks_the_policy_for_more(
    tmp_path: Path, recording: Recording
) -> None:
    """Over-selection 1.0 of C N = 3 asks the policy for 6 of the connected
    clients (at most all of them), as it asks the uniform draw."""
    cfg = _cfg(tmp_path, selection={"policy": "recording"})
    exp = build(cfg)
    exp.engine.over_selection = 1.0  # what a deployment's engine says
    live = [0, 2, 3, 5, 7, 8, 9, 11]
    got = sample(exp, 2, live, History())
    assert len(got) == 6 and set(got) <= set(live) and recording.told[2][0] == got
    assert len(sample(exp, 3, [1, 4, 6, 10], History())) == 4
    uniform = build(_cfg(tmp_path))
    uniform.engine.over_selection = 1.0
    assert sample(uniform, 2, live, History()) == sample_cohort(12, 0.5, 0, 2, False, live)

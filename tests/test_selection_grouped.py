"""The ``grouped_rotation`` selection policy: clients in fixed seeded groups
that take turns, checked against the groups and turns worked out here, in a
real run through the registry, and its bad options refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedforge
from fedforge.config import from_dict
from fedforge.core.errors import ConfigError
from fedforge.core.rng import numpy_rng
from fedforge.selection.grouped import GroupedRotation, make_groups
from fedforge.selection.history import History
from fedforge.selection.named import SelectionRound
from fedforge.store import RunStore


def ask(among: list[int], size: int, round_idx: int, n: int = 10) -> SelectionRound:
    view = History({}).view([1] * n)
    return SelectionRound(round_idx, among, size, view, np.random.default_rng(round_idx))


def test_groups_partition_the_clients_by_a_seeded_permutation() -> None:
    """10 clients in 3 groups: sizes 4, 3, 3 (array_split), together every id once,
    the same for the same seed, another split for another seed, and each group the
    consecutive slice of the seed's permutation."""
    groups = make_groups(10, 3, seed=7)
    assert [len(g) for g in groups] == [4, 3, 3]
    assert sorted(c for g in groups for c in g) == list(range(10))
    assert make_groups(10, 3, seed=7) == groups
    assert make_groups(10, 3, seed=8) != groups
    order = [int(c) for c in numpy_rng(7, "selection_groups").permutation(10)]
    assert groups == [sorted(order[:4]), sorted(order[4:7]), sorted(order[7:])]


def test_groups_take_turns_and_a_short_group_is_topped_up_from_the_next() -> None:
    """Groups A = [0, 1, 2], B = [3, 4], C = [5, 6, 7]. Cohorts of 2: round 0 two
    of A, round 1 exactly B, round 2 two of C, round 3 A again. Cohorts of 3 at
    round 1: B is short by one, so B and one of C. Client 4 away at round 1 with
    cohorts of 2: 3 and one of C. Upload periods of 2 rounds: round 2 is the
    second cohort, B's turn."""
    policy = GroupedRotation([[0, 1, 2], [3, 4], [5, 6, 7]])
    everyone = list(range(8))
    for r, group in [(0, {0, 1, 2}), (2, {5, 6, 7}), (3, {0, 1, 2}), (5, {5, 6, 7})]:
        got = policy.select(ask(everyone, 2, r))
        assert len(set(got)) == 2 and set(got) <= group
    assert sorted(policy.select(ask(everyone, 2, 1))) == [3, 4]
    got = policy.select(ask(everyone, 3, 1))
    assert got[:2] == [3, 4] and got[2] in {5, 6, 7}
    got = policy.select(ask([0, 1, 2, 3, 5, 6, 7], 2, 1))
    assert got[0] == 3 and got[1] in {5, 6, 7}
    periods = GroupedRotation([[0, 1, 2], [3, 4], [5, 6, 7]], every=2)
    assert sorted(periods.select(ask(everyone, 2, 2))) == [3, 4]


def _cfg(tmp_path: Path, **extra: Any) -> Any:
    base: dict[str, Any] = {
        "dataset": "synthetic",
        "model": "logreg",
        "num_clients": 12,
        "client_fraction": 0.25,
        "batch_size": None,
        "rounds": 6,
        "target_accuracy": None,
        "dtype": "float64",
        "engine": "serial",
        "seed": 3,
        "runs_dir": str(tmp_path),
    }
    return from_dict({**base, **extra})


def test_a_run_asks_each_group_in_turn(tmp_path: Path) -> None:
    """12 clients, cohorts of 3, the default groups (12 // 3 = 4 of 3): every
    round's cohort is the whole group of its turn, round r and r + 4 the same,
    and in 4 rounds every client asked exactly once."""
    run = fedforge.run(_cfg(tmp_path, selection={"policy": "grouped_rotation"}))
    with RunStore.open(run.run_dir) as store:
        rows = store.read_rows("cohorts")
    by_round: dict[int, list[int]] = {}
    for r, client, *_ in rows:
        by_round.setdefault(int(r), []).append(int(client))
    groups = make_groups(12, 4, seed=3)
    for r in range(6):
        assert sorted(by_round[r]) == groups[r % 4]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"groups": 13}, "plugin_options.grouped_rotation.groups = 13 must be at most"),
        ({"groups": 0}, "'plugin_options.grouped_rotation.groups' = 0"),
    ],
)
def test_bad_groups_are_refused_in_one_line(
    tmp_path: Path, options: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigError) as err:
        fedforge.build(
            _cfg(
                tmp_path,
                selection={"policy": "grouped_rotation"},
                plugin_options={"grouped_rotation": options},
            )
        )
    assert "\n" not in str(err.value) and said in str(err.value)

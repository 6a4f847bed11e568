"""The accountant counts the participation that happened: a round whose
collection summed nothing (every sampled client dropped out) releases nothing and
spends no budget; under local DP a client spends one mechanism per upload the
server saw, not per cohort it was sampled into. Checked against dp-accounting's
epsilon for the hand-counted releases and uploads."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MakeData

from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config import from_dict
from fedforge.engines.serial import SerialEngine
from fedforge.privacy.accountant import Accountant, local_epsilon
from fedforge.selection.sampling import sample_cohort
from fedforge.server.loop import RunResult, run
from fedforge.store import RunStore

ABSENT = frozenset({0, 1, 2, 3})  # these clients never answer
CFG: dict[str, Any] = {
    "model": "2nn",
    "engine": "serial",
    "num_clients": 6,
    "client_fraction": 0.5,
    "batch_size": 10,
    "lr": 0.05,
    "rounds": 8,
    "seed": 3,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
    # a round with one update applies it: only rounds with nothing to sum are skipped
    "robust": {"max_skipped_rounds": 8, "min_clients": 1},
}


def _run_with_absent(
    monkeypatch: pytest.MonkeyPatch,
    make_data: MakeData,
    tmp_path: Path,
    dp: str,
    absent: frozenset[int] = ABSENT,
    **extra: Any,
) -> RunResult:
    honest = SerialEngine.run_cohort

    def cohort(
        self: SerialEngine, tasks: Sequence[ClientTask], payload: bytes
    ) -> Iterator[ClientUpload]:
        return (u for u in honest(self, tasks, payload) if u.client_id not in absent)

    cfg = from_dict({**CFG, "runs_dir": str(tmp_path), "privacy": {"dp": dp}, **extra})
    with monkeypatch.context() as patch:
        patch.setattr(SerialEngine, "run_cohort", cohort)
        return run(cfg, data=make_data([20, 30, 25, 35, 30, 20]))


def _cohorts() -> list[list[int]]:
    return [sample_cohort(6, 0.5, CFG["seed"], r) for r in range(CFG["rounds"])]


def test_a_round_with_nothing_to_sum_spends_no_budget(
    monkeypatch: pytest.MonkeyPatch, make_data: MakeData, tmp_path: Path
) -> None:
    empty = [r for r, c in enumerate(_cohorts()) if set(c) <= ABSENT]
    assert empty and len(empty) < CFG["rounds"]  # the seed gives both kinds of round
    result = _run_with_absent(monkeypatch, make_data, tmp_path, "central")
    assert [r for r, _ in result.skipped] == empty
    delta = 6**-1.1
    acc = Accountant(1.0, 6, 3, delta)
    released = 0
    with RunStore.open(result.run_dir) as store:  # type: ignore[arg-type]
        spent = {r: eps for r, eps, _, _ in store.privacy()}
    for r in range(CFG["rounds"]):
        released += r not in empty
        assert spent[r] == pytest.approx(acc.epsilon(released), rel=1e-12)
    assert result.summary["privacy"]["epsilon"] == pytest.approx(acc.epsilon(released))
    assert released < CFG["rounds"]  # the planned count would have said more


def test_local_dp_counts_each_clients_real_uploads(
    monkeypatch: pytest.MonkeyPatch, make_data: MakeData, tmp_path: Path
) -> None:
    uploads: dict[int, int] = {}
    for cohort in _cohorts():
        for c in cohort:
            if c not in ABSENT:
                uploads[c] = uploads.get(c, 0) + 1
    sampled = sum(1 for cohort in _cohorts() for c in cohort if c in ABSENT)
    assert sampled > 0  # absent clients were sampled: planned counting would charge them
    result = _run_with_absent(monkeypatch, make_data, tmp_path, "local")
    want = {str(c): local_epsilon(1.0, k, 6**-1.1) for c, k in sorted(uploads.items())}
    got = result.summary["privacy"]["local_epsilon"]
    assert got.keys() == want.keys()
    for c, eps in want.items():
        assert got[c] == pytest.approx(eps, rel=1e-12)
    with RunStore.open(result.run_dir) as store:  # type: ignore[arg-type]
        seen = {c.client_id for r in range(CFG["rounds"]) for c in store.client_rounds(r)}
    assert {int(c) for c in got} == seen  # exactly the clients whose updates arrived


@pytest.mark.parametrize("dp", ["central", "local"])
def test_a_round_skipped_for_what_arrived_is_still_charged(
    monkeypatch: pytest.MonkeyPatch, make_data: MakeData, tmp_path: Path, dp: str
) -> None:
    """Rounds short of robust.min_clients (3) are skipped after uploads arrived:
    the skip tells of them, so central DP charges the round and local DP charges
    every client whose upload arrived; only rounds where nothing arrived are free."""
    absent = frozenset({0, 1})
    robust = {"max_skipped_rounds": 8, "min_clients": 3}
    result = _run_with_absent(monkeypatch, make_data, tmp_path, dp, absent, robust=robust)
    arrivals = [[c for c in cohort if c not in absent] for cohort in _cohorts()]
    short = [r for r, a in enumerate(arrivals) if 0 < len(a) < 3]
    assert short and [r for r, _ in result.skipped] == [
        r for r, a in enumerate(arrivals) if len(a) < 3
    ]
    delta = 6**-1.1
    if dp == "central":
        spent = sum(1 for a in arrivals if a)
        want = Accountant(1.0, 6, 3, delta).epsilon(spent)
        assert result.summary["privacy"]["epsilon"] == pytest.approx(want, rel=1e-12)
        return
    uploads: dict[int, int] = {}
    for a in arrivals:
        for c in a:
            uploads[c] = uploads.get(c, 0) + 1
    want_local = {str(c): local_epsilon(1.0, k, delta) for c, k in sorted(uploads.items())}
    got = result.summary["privacy"]["local_epsilon"]
    assert got.keys() == want_local.keys()
    for c, eps in want_local.items():
        assert got[c] == pytest.approx(eps, rel=1e-12)

"""Contracts a user's component cannot slip out of: a round hook that writes the
model or keeps state JSON cannot hold fails the run in one line naming it; an
algorithm's client half without tables takes worker processes (and gives what
one process gives); a stateless client half's tables are its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fedforge
from fedforge.algorithms import PendingClientTable, StatelessClientTerms
from fedforge.config import Config, override
from fedforge.engines import close_engine
from fedforge.server.hooks import HookError, RoundHook, RoundInfo
from fedforge.store import make_state_store

ROOT = Path(__file__).resolve().parents[1]


def small(tmp: Path, **extra: Any) -> Config:
    base = {
        "dataset": "synthetic", "model": "logreg", "num_clients": 8, "client_fraction": 0.5,
        "rounds": 2, "target_accuracy": None, "dtype": "float64", "engine": "serial",
        "runs_dir": str(tmp), "batch_size": 10, "lr": 0.05, "checkpoint_every": 1,
    }  # fmt: skip
    return override(Config(), {**base, **extra})


class Writer(RoundHook):
    name = "writer"

    def round_start(self, info: RoundInfo) -> None:
        info.params.add_(1.0)


@pytest.mark.parametrize(
    "state, why",
    [
        ({"seen": {1: 2}}, "would not come back from the checkpoint as it is"),
        ({"seen": (1, 2)}, "would not come back"),
        ({"norm": torch.ones(2)}, "is not JSON"),
    ],
)
def test_a_hook_state_json_cannot_hold_fails_in_one_line(
    tmp_path: Path, state: dict[str, Any], why: str
) -> None:
    class Keeper(RoundHook):
        name = "keeper"

        def state_dict(self) -> dict[str, Any]:
            return state

    with pytest.raises(HookError, match=f"round hook 'keeper': its state_dict.. {why}"):
        fedforge.run(small(tmp_path), hooks=[Keeper()], progress=False)


def test_a_hook_state_with_nan_and_nesting_is_kept(tmp_path: Path) -> None:
    class Keeper(RoundHook):
        name = "keeper"

        def state_dict(self) -> dict[str, Any]:
            return {"loss": float("nan"), "by_client": {"3": [1, 2.5, None, "x", True]}}

    fedforge.run(small(tmp_path), hooks=[Keeper()], progress=False)


def test_a_hook_that_writes_the_model_fails_naming_it(tmp_path: Path) -> None:
    with pytest.raises(HookError, match=r"round hook 'writer' wrote the round's model .* round 1"):
        fedforge.run(small(tmp_path), hooks=[Writer()], progress=False)


class Counts(StatelessClientTerms):
    """Sends its client's example count beside the delta; keeps nothing."""

    def end(self, job: Any) -> dict[str, torch.Tensor]:
        return {"n": torch.tensor([float(len(job.y))], dtype=job.start.dtype)}


def test_a_stateless_client_half_has_tables_of_its_own() -> None:
    a, b = Counts(), Counts()
    a.tables["x"] = make_state_store(2, 3, torch.float64)  # type: ignore[index]
    assert dict(b.tables) == {} and dict(a.tables) == {}
    store = make_state_store(2, 3, torch.float64)
    held = PendingClientTable("grad", store)
    assert dict(held.tables) == {"grad": store} and dict(Counts().tables) == {}


def test_an_algorithm_without_client_tables_takes_worker_processes(tmp_path: Path) -> None:
    """examples/fednova.py sends scalars and keeps no table: two worker processes
    run it, and end where one process ends, bit for bit."""
    fedforge.load_plugin(str(ROOT / "examples" / "fednova.py"))
    cfg = small(tmp_path, algorithm="fednova", aggregation_weights="num_examples")
    exp = fedforge.build(override(cfg, {"workers": 2}))
    try:
        assert type(exp.engine).__name__ == "PoolEngine", exp.engine
    finally:
        close_engine(exp.engine)
    one = fedforge.run(override(cfg, {"workers": 1, "name": "one"}), progress=False)
    two = fedforge.run(override(cfg, {"workers": 2, "name": "two"}), progress=False)
    assert torch.equal(one.params, two.params)

"""Robust aggregators that carry state across rounds (an adaptive norm bound's
recent norms, centred clipping's previous aggregate) checkpoint it: a run stopped
by SIGTERM and resumed equals the uninterrupted run bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.conftest import MakeData

from conftest import RunStopped
from fedforge import config as config_mod
from fedforge.robust.clipping import CentredClip, NormBound
from fedforge.server.loop import resume, run
from fedforge.server.state import load_aggregator_state
from fedforge.store import Checkpoint, CheckpointError

SIZES = [9, 7, 12, 5, 10]


@pytest.mark.parametrize("aggregator", ["norm_bound", "centred_clip"])
def test_resume_continues_the_aggregators_state(
    aggregator: str, make_data: MakeData, run_stopped: RunStopped, tmp_path: Path
) -> None:
    data = make_data(SIZES)
    cfg = config_mod.Config(
        model="2nn", engine="serial", num_clients=len(SIZES), client_fraction=1.0,
        batch_size=4, lr=0.05, rounds=5, target_accuracy=None,
        evaluation=config_mod.EvaluationConfig(every=5),
        dtype="float64", checkpoint_every=1,
        robust=config_mod.RobustConfig(aggregator=aggregator, norm_bound=None, norm_window=3),
    )  # fmt: skip
    full = run(config_mod.override(cfg, {"runs_dir": str(tmp_path / "a")}), data)
    stopped = run_stopped(config_mod.override(cfg, {"runs_dir": str(tmp_path / "b")}), data, 1)
    assert stopped.stopped == "SIGTERM"
    resumed = resume(stopped.run_dir, data)
    assert torch.equal(resumed.params, full.params)


def test_adaptive_bound_state_round_trips() -> None:
    clip = CentredClip(bound=None, window=2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        clip.aggregate(torch.randn(4, 6, generator=gen, dtype=torch.float64), torch.ones(4))
    state = clip.state_dict()
    assert state["bound/counts"].tolist() == [4, 4]  # the last two rounds, four clients each
    fresh = CentredClip(bound=None, window=2)
    fresh.load_state_dict(state)
    u = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    assert torch.equal(fresh.aggregate(u, torch.ones(4)), clip.aggregate(u, torch.ones(4)))
    assert NormBound(bound=1.0).state_dict() == {}  # a fixed bound keeps nothing


def test_checkpoint_with_state_the_aggregator_cannot_hold_is_refused() -> None:
    ckpt = Checkpoint(0, torch.zeros(3), aggregator_state={"centre": torch.zeros(3)})
    with pytest.raises(CheckpointError, match="aggregator state.*centre.*keeps none"):
        load_aggregator_state(object(), ckpt)
    bad = Checkpoint(
        0, torch.zeros(3), aggregator_state={"norms": torch.ones(3), "counts": torch.tensor([5])}
    )
    with pytest.raises(CheckpointError, match="1 rounds of 3 norms do not fit"):
        load_aggregator_state(NormBound(bound=None, window=2), bad)

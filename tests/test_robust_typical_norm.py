"""The default bound on an update's size relative to the recent rounds' median
norm (``robust.max_norm_multiple``), and the server step that is never taken to
a non-finite model: the rule on hand examples, a scaled-update attacker on real
MNIST against the honest run, the refusal's reason, and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import MakeData, RunStopped
from fedforge.config import (
    Config,
    EvaluationConfig,
    PartitionConfig,
    RobustConfig,
    from_dict,
    override,
)
from fedforge.data.federated import FederatedData, load_federated_data
from fedforge.data.user import from_tensors
from fedforge.report.progress import Progress
from fedforge.robust.attacks import attacker_ids
from fedforge.robust.typical_norm import RelativeBound, remember, typical_norm
from fedforge.server.collectors.base import RoundLog
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run
from fedforge.server.round import server_step
from fedforge.server.state import LoopState
from fedforge.store import ClientRecord
from fedforge.store.checkpoint import list_checkpoints


def test_the_median_rule_on_hand_examples() -> None:
    # norms 1, 2, 3 then 2.5: sorted 1, 2, 2.5, 3, the lower middle 2; the bound 10 x 2
    bound = RelativeBound.of(10.0, [[1.0, 2.0, 3.0], [2.5]])
    assert (bound.typical, bound.rounds, bound.waits) == (2.0, 2, False)
    assert bound.refusal(20.0) is None
    assert bound.refusal(20.5) == (
        "update norm 20.5 passes the bound 20 = robust.max_norm_multiple (10) x 2, "
        "the median norm of the updates taken in the last 2 rounds"
    )
    # no round behind it: it waits, and judges the round's own norms by their median
    first = RelativeBound.of(10.0, [])
    assert first.waits and first.refusal(1e30) is None
    # 1.1, 3.5, 2.0, 45000: the lower middle of the sorted four is 2.0, the bound 20
    assert first.cohort_refusals([1.1, 3.5, 2.0, 45_000.0]) == [
        None,
        None,
        None,
        "update norm 4.5e+04 passes the bound 20 = robust.max_norm_multiple (10) x 2, "
        "the median norm of this round's uploads (no earlier round took any)",
    ]
    # one honest update beside an attacker: the lower middle value is the honest one
    assert first.cohort_refusals([2.0, 1e6])[0] is None
    assert "1e+06 passes the bound 20" in str(first.cohort_refusals([2.0, 1e6])[1])
    # an empty round sets no bound; the window keeps the last rounds that took updates
    assert typical_norm([[0.0, 0.0]]) is None and typical_norm([]) is None
    assert first.cohort_refusals([0.0, 0.0, 5.0]) == [None, None, None]
    assert remember([[1.0], [2.0]], [3.0, 4.0], 2) == [[2.0], [3.0, 4.0]]
    assert remember([[1.0]], [], 2) == [[1.0]]


def test_the_bound_is_checked_with_the_config() -> None:
    from fedforge.core.errors import ConfigError

    for bad in (0.5, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="robust.max_norm_multiple"):
            from_dict({"robust": {"max_norm_multiple": bad}})
    assert RobustConfig().max_norm_multiple == 10.0


def _mnist(root: Path) -> FederatedData:
    """The first 3,000 MNIST training images over 10 clients (IID, 300 each) and
    1,000 test images: small enough for seconds a run."""
    cfg = Config(data_dir=str(root), num_clients=10, partition=PartitionConfig(kind="iid"))
    full = load_federated_data(cfg)
    parts = [torch.arange(k * 300, (k + 1) * 300).numpy() for k in range(10)]
    return from_tensors(
        full.train_x[:3000], full.train_y[:3000], full.test_x[:1000], full.test_y[:1000],
        parts, num_classes=10,
    )  # fmt: skip


def _cfg(**robust: object) -> Config:
    return Config(
        model="2nn", num_clients=10, client_fraction=1.0, local_epochs=1, batch_size=20,
        lr=0.1, rounds=4, target_accuracy=None, seed=3, checkpoint_every=0,
        robust=RobustConfig(**robust),  # type: ignore[arg-type]
    )  # fmt: skip


def test_one_scaled_attacker_under_the_default_bound_costs_under_a_point(
    mnist_dir: Path, one_thread: None
) -> None:
    """One of 10 clients sends 10^4 x its update (norm ~10^4 where honest ones are
    ~1-3, inside the absolute bound 100 x (||w|| + sqrt P) ~ 4.5e4). Under the
    default config it is refused every round (round 1 by that round's median,
    then by the recent rounds') and the accuracy is the honest run's to within
    a point; with the relative bound off the same attack wrecks the model and
    no later round can use an update (the honest ones are non-finite)."""
    data = _mnist(mnist_dir)
    honest = run(_cfg(), data=data, progress=False, store=False)
    attack = {"attack": "scaled", "attack_fraction": 0.1, "attack_scale": 1e4}
    attacked = run(_cfg(**attack), data=data, progress=False, store=False)
    (bad,) = attacker_ids(10, 0.1, 3)
    assert [(r, c) for r, c, _ in attacked.rejected] == [(r, bad) for r in range(4)]
    first, *later = [why for _, _, why in attacked.rejected]
    assert "the median norm of this round's uploads" in first
    assert all("the median norm of the updates taken in the last" in w for w in later)
    acc_honest, acc_attacked = honest.rounds[-1].test_accuracy, attacked.rounds[-1].test_accuracy
    assert acc_honest is not None and acc_attacked is not None and acc_honest > 0.8
    assert abs(acc_honest - acc_attacked) <= 0.01
    wrecked = run(_cfg(max_norm_multiple=None, **attack), data=data, progress=False, store=False)
    assert not [c for r, c, _ in wrecked.rejected if r == 0]  # under the absolute bound
    # then honest updates are non-finite: the model stays where the attack left it
    assert [r for r, _ in wrecked.skipped] == [1, 2, 3]
    assert any("non-finite" in why for r, _, why in wrecked.rejected if r == 1)
    acc_wrecked = wrecked.rounds[-1].test_accuracy
    assert acc_wrecked is not None and acc_wrecked < acc_honest - 0.2


def test_a_step_to_a_non_finite_model_is_not_taken(make_data: MakeData) -> None:
    """A finite aggregate whose step overflows float32 (3e38 + 3e38): the round is
    skipped with the reason, the model and the server momentum are as before the
    step, and no client counts as used; a step that stays finite is taken."""
    cfg = from_dict(
        {
            "model": "logreg", "num_clients": 2, "client_fraction": 1.0, "rounds": 1,
            "target_accuracy": None, "dtype": "float32", "checkpoint_every": 0,
            "server_optimizer": {"momentum": 0.5},
        }
    )  # fmt: skip
    exp = build(cfg, make_data([4, 4], dtype=torch.float32))
    state = LoopState.fresh(exp)
    log = RoundLog(state.rejected, state.skipped, Progress(1, "t", enabled=False), 0)
    record = ClientRecord(0, 0, 4, 0.5, 1.0, 10, 10)
    small = torch.full_like(state.params, 0.25)
    assert server_step(exp, state, small, {0: record}, None, log) == {0: record}
    assert torch.equal(state.params, exp.initial_params + 0.25)  # lr 1: x + aggregate
    state.params = torch.full_like(state.params, 3e38)
    before, velocity = state.params.clone(), state.optimizer.state_dict()["velocity"]
    huge = torch.full_like(state.params, 3e38)
    assert bool(torch.isfinite(huge).all())
    assert server_step(exp, state, huge, {0: record}, None, log) == {}
    assert torch.equal(state.params, before)
    assert torch.equal(state.optimizer.state_dict()["velocity"], velocity)
    assert state.skipped == [
        (
            0,
            "the server step would make the model non-finite (inf or NaN in torch.float32); "
            "the last good model is kept",
        )
    ]


def test_resume_continues_the_recent_norms_exactly(
    make_data: MakeData, run_stopped: RunStopped, tmp_path: Path
) -> None:
    """The recent rounds' norms are in every checkpoint: a run stopped after round 2
    and resumed equals the uninterrupted run bit for bit, and its checkpoint holds
    the norms of rounds 1 and 2 (window 2: the bound of round 3 depends on them)."""
    data = make_data([9, 7, 12, 5, 10])
    cfg = Config(
        model="2nn", engine="serial", num_clients=5, client_fraction=0.6, batch_size=4,
        lr=0.05, rounds=4, target_accuracy=None,
        evaluation=EvaluationConfig(every=4), dtype="float64",
        checkpoint_every=1,
        robust=RobustConfig(attack="scaled", attack_fraction=0.2, attack_scale=1e3, norm_window=2),
    )  # fmt: skip
    full = run(override(cfg, {"runs_dir": str(tmp_path / "a")}), data)
    stopped = run_stopped(override(cfg, {"runs_dir": str(tmp_path / "b")}), data, 1)
    assert stopped.stopped == "SIGTERM" and stopped.run_dir is not None
    newest = list_checkpoints(stopped.run_dir)[0]
    norms = json.loads((newest / "meta.json").read_text())["loop"]["update_norms"]
    assert len(norms) == 2 and all(len(r) >= 1 and all(0 < x < 1e3 for x in r) for r in norms)
    resumed = resume(stopped.run_dir, data)
    assert torch.equal(resumed.params, full.params)
    assert resumed.rejected == full.rejected and full.rejected

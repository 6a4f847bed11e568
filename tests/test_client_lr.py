"""A per-client learning rate (``local.lr_rule``) and the upload clip relative to
recent norms (``communication.clip_multiple``), against hand computations: full
batch gradient descent of a logistic regression written out (softmax minus
one-hot), and the lower-middle median of norms taken from the uploads."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import TINY_LOGREG, MakeData

from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config import from_dict
from fedforge.core import wire
from fedforge.core.errors import ConfigError
from fedforge.engines import SimulationEngine
from fedforge.report.progress import Progress
from fedforge.server.client_lr import upload_clip
from fedforge.server.experiment import build
from fedforge.server.round import configure, run_round
from fedforge.server.state import LoopState

SIZES = [12, 30, 18, 24]
SCALES = {0: 0.5, 2: 3.0, 3: 0.25}  # client 1 is not in the file: scale 1


def _csv(tmp: Path, text: str) -> str:
    path = tmp / "scales.csv"
    path.write_text(text)
    return str(path)


def _cfg(**more: Any) -> Any:
    return from_dict({**TINY_LOGREG, "num_clients": len(SIZES), **more})


def _hand_gd(
    w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int
) -> torch.Tensor:
    """Full-batch gradient descent of softmax regression on the flat parameters
    [W (10 x d) row-major, b (10)]: grad W = (P - Y)^T X / n, grad b = mean(P - Y)."""
    x = x.flatten(start_dim=1)
    d = x.shape[1]
    for _ in range(steps):
        weight, bias = w[: 10 * d].view(10, d), w[10 * d :]
        p = torch.softmax(x @ weight.T + bias, dim=1)
        err = p - torch.nn.functional.one_hot(y, 10).to(p.dtype)
        grad = torch.cat([(err.T @ x / len(y)).reshape(-1), err.mean(dim=0)])
        w = w - lr * grad
    return w


def _delta(up: ClientUpload) -> torch.Tensor:
    return wire.decode(up.data).tensors["delta"]


@pytest.mark.parametrize("engine", ["serial", "vectorized"])
def test_csv_scales_give_each_client_the_update_of_its_scaled_lr(
    make_data: MakeData, tmp_path: Path, engine: str
) -> None:
    path = _csv(tmp_path, "client_id,lr_scale\n0,0.5\n2,3\n3,0.25\n")
    cfg = _cfg(
        engine=engine,
        batch_size=None,
        local_epochs=3,
        local={"lr_rule": "lr_csv"},
        plugin_options={"lr_csv": {"path": path}},
    )
    data = make_data(SIZES, seed=2)
    exp = build(cfg, data)
    state = LoopState.fresh(exp)
    orders = configure(exp, state, 0, 0, list(range(len(SIZES))))
    lrs = {t.client_id: t.plan.lr for t in orders.tasks}
    assert lrs == {c: 0.05 * SCALES.get(c, 1.0) for c in range(len(SIZES))}
    assert [e.name for e in exp.spec.entries] == ["fc.weight", "fc.bias"]
    ups = {u.client_id: u for u in exp.engine.run_cohort(orders.tasks, orders.payload)}
    for c in range(len(SIZES)):
        x, y = data.client_data(c)
        want = _hand_gd(state.params, x, y, lrs[c], 3) - state.params
        assert torch.allclose(_delta(ups[c]), want, rtol=0, atol=1e-10), c
    # a scale matters: client 2's update is not the one of the plan's lr
    x, y = data.client_data(2)
    plain = _hand_gd(state.params, x, y, 0.05, 3) - state.params
    assert (_delta(ups[2]) - plain).norm() > 0.1 * plain.norm()


def test_data_size_rule_by_hand(make_data: MakeData) -> None:
    """(n_k / mean n)^exponent, mean of the cohort (12, 30, 18, 24: 21), held to
    [0.7, 1.3]: 12/21 = 0.571 -> 0.7; 30/21 = 1.429 -> 1.3; 18/21; 24/21."""
    cfg = _cfg(
        local={"lr_rule": "data_size"},
        plugin_options={"data_size": {"min_scale": 0.7, "max_scale": 1.3}},
    )
    exp = build(cfg, make_data(SIZES))
    orders = configure(exp, LoopState.fresh(exp), 0, 0, [0, 1, 2, 3])
    got = {t.client_id: t.plan.lr / 0.05 for t in orders.tasks}
    want = {0: 0.7, 1: 1.3, 2: 18 / 21, 3: 24 / 21}
    assert got == pytest.approx(want, rel=1e-12)


def test_reported_loss_rule_reads_the_losses_clients_reported(make_data: MakeData) -> None:
    """After a round, each client's scale is (loss_k / median)^-1 of the losses
    its update reported (the lower middle of four for the median); before any
    report, the plan's lr."""
    cfg = _cfg(local={"lr_rule": "reported_loss"})
    exp = build(cfg, make_data(SIZES, seed=3))
    state = LoopState.fresh(exp)
    first = configure(exp, state, 0, 0, [0, 1, 2, 3])
    assert {t.plan.lr for t in first.tasks} == {0.05}
    seen: dict[int, float] = {}
    exp.engine = _Recording(exp.engine, seen)
    run_round(exp, state, 0, Progress(1, "t", enabled=False))
    losses = sorted(seen.values())
    median = losses[1]  # torch's lower middle of four
    second = configure(exp, state, 1, 1, [0, 1, 2, 3])
    want = {c: min(max(median / loss, 0.25), 4.0) for c, loss in seen.items()}
    assert {t.client_id: t.plan.lr / 0.05 for t in second.tasks} == pytest.approx(want)
    assert len({round(v, 9) for v in want.values()}) > 1


class _Recording(SimulationEngine):
    """The inner engine; each upload's reported train loss kept in ``losses`` and
    each round's tasks in ``tasks``."""

    def __init__(self, inner: Any, losses: dict[int, float] | None = None) -> None:
        self.inner, self.losses, self.name = inner, losses, inner.name
        self.tasks: list[list[ClientTask]] = []
        self.uploads: list[dict[int, ClientUpload]] = []

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        self.tasks.append(list(tasks))
        ups = list(self.inner.run_cohort(tasks, payload))
        self.uploads.append({u.client_id: u for u in ups})
        for u in ups:
            if self.losses is not None:
                self.losses[u.client_id] = float(wire.decode(u.data).meta["train_loss"])
            yield u

    def run_phase(self, phase: str, messages: Any) -> dict[int, bytes]:
        return self.inner.run_phase(phase, messages)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("client_id,lr_scale\n7,1.0\n", "client_id '7' is not a client"),
        ("client_id,lr_scale\n1,-2\n", "lr_scale '-2' for client 1"),
        ("client_id,lr_scale\n1,nan\n", "lr_scale 'nan' for client 1"),
        ("id,scale\n1,2\n", "header is 'id,scale'"),
        ("client_id,lr_scale\n1,2\n1,3\n", "client 1 is given twice"),
    ],
)
def test_a_bad_scale_file_is_one_line(
    make_data: MakeData, tmp_path: Path, text: str, says: str
) -> None:
    options = {"lr_csv": {"path": _csv(tmp_path, text)}}
    cfg = _cfg(local={"lr_rule": "lr_csv"}, plugin_options=options)
    with pytest.raises(ConfigError, match="plugin_options.lr_csv.path") as err:
        build(cfg, make_data(SIZES))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_missing_scale_file_and_unknown_rule_are_refused(
    make_data: MakeData, tmp_path: Path
) -> None:
    missing = str(tmp_path / "none.csv")
    cfg = _cfg(local={"lr_rule": "lr_csv"}, plugin_options={"lr_csv": {"path": missing}})
    with pytest.raises(ConfigError, match="none.csv.*cannot read it"):
        build(cfg, make_data(SIZES))
    with pytest.raises(ConfigError, match="local.lr_rule"):
        _cfg(local={"lr_rule": "by_magic"})
    with pytest.raises(ConfigError, match="max_scale"):
        build(
            _cfg(
                local={"lr_rule": "data_size"},
                plugin_options={"data_size": {"min_scale": 2.0, "max_scale": 1.0}},
            ),
            make_data(SIZES),
        )
    with pytest.raises(ConfigError, match="fedbuff"):
        _cfg(local={"lr_rule": "data_size"}, asynchronous={"mode": "fedbuff"})
    with pytest.raises(ConfigError, match="clip_multiple"):
        _cfg(communication={"clip_multiple": 2.0}, privacy={"dp": "central"})


def test_upload_clip_is_the_multiple_of_the_median_of_recent_norms() -> None:
    """Norms 1, 3, 2 then 4: the upper middle of 1, 2, 3, 4 is 3; x 1.5 = 4.5. No
    norm behind the round (the first): no bound."""
    assert upload_clip(1.5, [[1.0, 3.0, 2.0], [4.0]]) == 4.5
    assert upload_clip(1.5, [[5.0]]) == 7.5
    assert upload_clip(1.5, []) is None
    assert upload_clip(None, [[1.0]]) is None


def test_clients_clip_to_the_multiple_of_last_rounds_median(make_data: MakeData) -> None:
    """Round 1 sends no bound (nothing behind it): its uploads are those of a run
    without the option. Round 2's bound is 0.5 x the upper median of round 1's
    upload norms, computed here from the uploads; each round-2 upload is the unclipped
    run's delta scaled by min(1, bound / its norm)."""
    data = make_data(SIZES, seed=4)
    runs = {}
    for multiple in (None, 0.5):
        cfg = _cfg(rounds=2, communication={"clip_multiple": multiple}, robust={"norm_window": 1})
        exp = build(cfg, data)
        exp.engine = rec = _Recording(exp.engine)
        state = LoopState.fresh(exp)
        for r in range(2):
            run_round(exp, state, r, Progress(2, "t", enabled=False))
        runs[multiple] = rec
    plain, clipped = runs[None], runs[0.5]
    assert all(t.plan.upload_clip is None for t in clipped.tasks[0])
    for c, up in plain.uploads[0].items():
        assert torch.equal(_delta(clipped.uploads[0][c]), _delta(up))
    norms = sorted(float(_delta(u).norm()) for u in plain.uploads[0].values())
    bound = 0.5 * norms[len(norms) // 2]
    assert [t.plan.upload_clip for t in clipped.tasks[1]] == pytest.approx([bound] * len(SIZES))
    cut = 0
    for c, up in plain.uploads[1].items():
        raw = _delta(up)
        want = raw * min(1.0, bound / float(raw.norm()))
        cut += float(raw.norm()) > bound
        assert torch.allclose(_delta(clipped.uploads[1][c]), want, rtol=0, atol=1e-12)
    assert cut >= 2  # round 2 moves less than round 1, yet half its median clips some

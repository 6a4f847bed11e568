"""A model of the caller's own, registered by name: it trains on every engine
with the same numbers (float64), is seeded like the built-in ones, resumes
exactly once registered again, and is refused clearly when it is not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import fedforge as ff
from conftest import MakeData, RunStopped
from fedforge.core.errors import ConfigError, DataError
from fedforge.models import MODELS


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 5, padding=2)
        self.fc = nn.Linear(4 * 14 * 14, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(h.flatten(start_dim=-3))


class Renamed(TinyCNN):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = self.conv, self.fc
        del self.conv, self.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.first(x)), 2)
        return self.last(h.flatten(start_dim=-3))


@pytest.fixture
def registered() -> Iterator[None]:
    ff.register_model("tiny_cnn", TinyCNN)
    ff.register_model("linear60", lambda: nn.Linear(60, 10))
    yield
    for name in ("tiny_cnn", "linear60"):
        MODELS.pop(name, None)


BASE = {
    "model": "tiny_cnn", "num_clients": 4, "client_fraction": 0.5, "batch_size": 4,
    "lr": 0.05, "rounds": 3, "target_accuracy": None, "dtype": "float64",
    "checkpoint_every": 1,
}  # fmt: skip


def test_a_registered_model_runs_alike_on_every_engine(
    registered: None, make_data: MakeData, one_thread: None
) -> None:
    data = make_data([7, 12, 5, 9], dtype=torch.float64)
    serial = ff.run(ff.config.from_dict({**BASE, "engine": "serial"}), data=data, store=False)
    vector = ff.run(ff.config.from_dict({**BASE, "engine": "vectorized"}), data=data, store=False)
    assert vector.summary["engine"] == "vectorized" and serial.params.numel() == 104 + 7_850
    start = ff.build(ff.config.from_dict(BASE), data).initial_params
    assert (serial.params - start).abs().max() > 1e-4
    assert (serial.params - vector.params).abs().max() < 1e-9
    with torch.random.fork_rng():  # seeded like a built-in model: the init is the seed's
        torch.manual_seed(123)
        again = ff.build(ff.config.from_dict(BASE), data).initial_params
    assert torch.equal(again, start)


class FixedScale(nn.Module):
    """An MLP with a fixed input scale (a buffer) and a frozen first layer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_std", torch.full((784,), 0.5))
        self.fc1 = nn.Linear(784, 16)
        self.fc1.requires_grad_(False)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1) * self.inv_std)))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_buffers_and_frozen_parameters_never_move_on_any_engine(
    make_data: MakeData, one_thread: None, momentum: float
) -> None:
    """torch.optim.SGD leaves a buffer and a requires_grad=False parameter alone,
    and so does every engine: the vectorised engine stepped every entry of the
    flat vector (the buffer drifted from 0.5 to 0.498-0.502 in two rounds, the
    engines 2e-3 apart), and both engines trained the frozen layer. Against a
    plain nn.Module + torch.optim.SGD loop for the first round's clients."""
    from fedforge.core.rng import torch_generator

    ff.register_model("fixed_scale", FixedScale)
    try:
        data = make_data([7, 12, 9, 5], dtype=torch.float64)
        cfg = {**BASE, "model": "fixed_scale", "client_fraction": 1.0, "rounds": 1,
               "checkpoint_every": 0, "local": {"momentum": momentum}}  # fmt: skip
        runs = {
            e: ff.run(ff.config.from_dict({**cfg, "engine": e}), data=data, store=False)
            for e in ("serial", "vectorized")
        }
        exp = ff.build(ff.config.from_dict(cfg), data)
    finally:
        MODELS.pop("fixed_scale", None)
    assert runs["vectorized"].summary["engine"] == "vectorized"
    start = exp.spec.views(exp.initial_params)
    # the plain loop: each client from the start, torch.optim.SGD, the run's batches
    model = FixedScale().to(torch.float64)
    deltas, sizes = [], []
    for k, idx in enumerate(data.partition.client_indices):
        model.load_state_dict({n: start[n].clone() for n in model.state_dict()})
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05,
                              momentum=momentum)  # fmt: skip
        xs, ys = data.train_x[list(idx)], data.train_y[list(idx)]
        order = torch.randperm(
            len(ys),
            generator=torch_generator(exp.cfg.seed, "minibatch", 0, k),
        )
        for b in order.split(4):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xs[b]), ys[b]).backward()
            opt.step()
        deltas.append(torch.cat([model.state_dict()[n].reshape(-1) - start[n].reshape(-1)
                                 for n in start]))  # fmt: skip
        sizes.append(len(ys))
    want = exp.initial_params + sum(n * d for n, d in zip(sizes, deltas, strict=True)) / sum(sizes)
    for name, r in runs.items():
        got = exp.spec.views(r.params)
        assert torch.equal(got["inv_std"], start["inv_std"]), name
        assert torch.equal(got["fc1.weight"], start["fc1.weight"]), name
        assert not torch.equal(got["fc2.weight"], start["fc2.weight"]), name
        torch.testing.assert_close(r.params, want, rtol=0, atol=1e-12)


def test_a_registered_model_resumes_exactly(
    registered: None, make_data: MakeData, one_thread: None, tmp_path: Any, run_stopped: RunStopped
) -> None:
    data = make_data([7, 12, 5, 9], dtype=torch.float64)
    want = ff.run(ff.config.from_dict({**BASE, "runs_dir": str(tmp_path / "a")}), data=data)
    stopped = run_stopped(ff.config.from_dict({**BASE, "runs_dir": str(tmp_path / "b")}), data, 1)
    assert stopped.stopped == "SIGTERM"
    MODELS.pop("tiny_cnn")  # a new process: nothing registered
    with pytest.raises(ConfigError, match="model 'tiny_cnn' is unknown.*register_model"):
        ff.resume(stopped.run_dir, data=data)
    from fedforge.report.runs import format_run_summary
    from fedforge.store import RunStore

    with RunStore.open(stopped.run_dir) as store:  # show needs no registry
        assert "tiny_cnn" in format_run_summary(store)
    ff.register_model("tiny_cnn", Renamed)  # the same shapes under other names
    with pytest.raises(ff.FedforgeError, match="a model of another layout"):
        ff.resume(stopped.run_dir, data=data)
    ff.register_model("tiny_cnn", TinyCNN)
    got = ff.resume(stopped.run_dir, data=data)
    assert torch.equal(got.params, want.params)


def test_registered_models_on_the_synthetic_data_and_the_refusals(
    registered: None, one_thread: None
) -> None:
    synthetic = {"dataset": "synthetic", "num_clients": 4, "rounds": 1, "target_accuracy": None}
    result = ff.run(ff.config.from_dict({**synthetic, "model": "linear60"}), store=False)
    assert result.params.numel() == 610
    with pytest.raises(DataError, match="train_x rows of shape \\(60,\\) do not fit model"):
        ff.build(ff.config.from_dict({**synthetic, "model": "tiny_cnn"}))
    with pytest.raises(ConfigError, match="model 'resnet' is unknown.*register_model"):
        ff.build(ff.config.from_dict({**synthetic, "model": "resnet"}))
    with pytest.raises(ConfigError, match="cannot be registered"):
        ff.register_model("cnn", TinyCNN)
    ff.register_model("broken", lambda: "not a module")  # type: ignore[arg-type,return-value]
    try:
        with pytest.raises(ConfigError, match="returned str, not a Module"):
            ff.build(ff.config.from_dict({**synthetic, "model": "broken"}))
    finally:
        MODELS.pop("broken")


def test_per_fedavg_refuses_running_statistics_not_every_norm(one_thread: None) -> None:
    """Layer norm keeps no running statistics: Per-FedAvg takes it; batch norm's
    statistics would move three times a step: refused (layer norm was too)."""
    synthetic = {"dataset": "synthetic", "num_clients": 4, "rounds": 1, "target_accuracy": None,
                 "algorithm": "perfedavg"}  # fmt: skip
    ff.register_model("ln60", lambda: nn.Sequential(nn.LayerNorm(60), nn.Linear(60, 10)))
    ff.register_model("bn60", lambda: nn.Sequential(nn.BatchNorm1d(60), nn.Linear(60, 10)))
    try:
        result = ff.run(ff.config.from_dict({**synthetic, "model": "ln60"}), store=False)
        assert len(result.rounds) == 1
        with pytest.raises(ConfigError, match="batch norm's running statistics"):
            ff.build(ff.config.from_dict({**synthetic, "model": "bn60"}))
    finally:
        MODELS.pop("ln60"), MODELS.pop("bn60")


@pytest.mark.parametrize(
    "priv", [{"dp": "central"}, {"dp": "local"}], ids=["central-dp", "local-dp"]
)
def test_dp_noise_leaves_frozen_parameters_alone(
    make_data: MakeData, one_thread: None, priv: dict[str, Any]
) -> None:
    """Noise protects what clients can change; it moved a frozen layer by ~1 a
    round (a random walk). The trainable layer still moves."""
    ff.register_model("fixed_scale", FixedScale)
    try:
        data = make_data([7, 12, 9, 5], dtype=torch.float64)
        cfg = {**BASE, "model": "fixed_scale", "client_fraction": 1.0, "rounds": 2,
               "checkpoint_every": 0,
               "privacy": {**priv, "clip_norm": 1.0, "noise_multiplier": 1.0}}  # fmt: skip
        result = ff.run(ff.config.from_dict(cfg), data=data, store=False)
        exp = ff.build(ff.config.from_dict(cfg), data)
    finally:
        MODELS.pop("fixed_scale", None)
    got, start = exp.spec.views(result.params), exp.spec.views(exp.initial_params)
    assert torch.equal(got["fc1.weight"], start["fc1.weight"])
    assert not torch.equal(got["fc2.weight"], start["fc2.weight"])


def test_the_fused_paths_leave_a_frozen_built_in_layer_to_autograd() -> None:
    """The fused perceptron and CNN steps update every weight they know: a model
    with a frozen layer goes to the vmap or autograd path instead."""
    from fedforge.algorithms import LocalPlan
    from fedforge.algorithms.base import cross_entropy
    from fedforge.client.cnn_step import applies
    from fedforge.engines.batched_mlp import mlp_layers
    from fedforge.models.layout import set_channels_last
    from fedforge.models.mnist import MnistCNN, MnistMLP

    mlp = MnistMLP()
    assert mlp_layers(mlp) == ["fc1", "fc2", "fc3"]
    frozen = nn.Linear(60, 10).requires_grad_(False)
    ff.register_model("all_frozen", lambda: frozen)
    try:
        synthetic = {"dataset": "synthetic", "num_clients": 4, "model": "all_frozen"}
        with pytest.raises(ConfigError, match="'all_frozen' has no parameter to train"):
            ff.build(ff.config.from_dict(synthetic))
    finally:
        MODELS.pop("all_frozen", None)
    mlp.fc1.requires_grad_(False)
    assert mlp_layers(mlp) is None
    cnn = MnistCNN()
    set_channels_last(cnn, True)
    plan = LocalPlan(1, 10, 0.1)
    assert applies(cnn, plan, cross_entropy, None, None, torch.float32)
    cnn.fc1.requires_grad_(False)
    assert not applies(cnn, plan, cross_entropy, None, None, torch.float32)

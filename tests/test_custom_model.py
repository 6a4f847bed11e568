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
from fedforge.errors import ConfigError, DataError
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

"""The run's start-up estimate of its local training: a line when it passes a day
(``local_epochs: 1000000000``, or a long run with one client holding all of MNIST
on the CNN); none for the shipped configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedforge.config import Config, load, override
from fedforge.server.loop import run
from fedforge.server.workload import DAY_SECONDS, estimated_seconds, workload_warning

MNIST_IID = [600] * 100  # 60,000 training examples over the default 100 clients


def test_a_billion_local_epochs_is_named() -> None:
    cfg = Config(local_epochs=1_000_000_000)
    line = workload_warning(cfg, MNIST_IID)
    assert line is not None and "\n" not in line
    assert "local_epochs 1000000000" in line and "years" in line and "'cnn'" in line
    assert workload_warning(Config(), MNIST_IID) is None


def test_one_client_holding_all_of_mnist_on_the_cnn() -> None:
    cfg = Config(num_clients=1, client_fraction=1.0, local_epochs=20, rounds=200)
    assert estimated_seconds(cfg, [60_000]) > DAY_SECONDS
    assert "days" in (workload_warning(cfg, [60_000]) or "")
    # resumed at its last round: what is left is a round, not a day
    assert workload_warning(cfg, [60_000], first_round=199) is None


def test_the_default_configs_are_not_named() -> None:
    """The default job and the paper's shorter grid points run well within a day
    (of the shipped configs only cnn_noniid_e20_binf, 1,344 rounds of E = 20 on
    the CNN, ~30 h at full length, is named: its target usually stops it sooner)."""
    root = Path(__file__).resolve().parents[1] / "configs"
    for name in ("default.yaml", "cnn_iid_e5_b10.yaml", "2nn_noniid_e20_binf.yaml"):
        cfg = load(root / name)
        assert workload_warning(cfg, [60_000 // cfg.num_clients] * cfg.num_clients) is None
    assert workload_warning(Config(), MNIST_IID) is None


def test_the_run_prints_the_line_at_start(
    make_data: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Printed before the first round (the run here is stopped by its budget of
    one round, so that it ends)."""
    data = make_data([5, 6, 7, 8], dtype=torch.float32)  # type: ignore[operator]
    cfg = override(Config(), {"model": "2nn", "num_clients": 4, "rounds": 1})
    monkeypatch.setattr("fedforge.server.workload.DAY_SECONDS", 1e-9)
    run(cfg, data=data, store=False)
    assert "fedforge: this run may train on" in capsys.readouterr().err

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


def test_ten_thousand_local_epochs_are_named() -> None:
    """60 rounds x 10% of 60,000 examples x 10,000 epochs = 3.6e9 examples, at
    1,500 a second 2.4e6 s: 27.8 days."""
    cfg = Config(local_epochs=10_000)
    line = workload_warning(cfg, MNIST_IID)
    assert line is not None and "\n" not in line
    assert "local_epochs 10000" in line and "27.8 days" in line and "'cnn'" in line
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


@pytest.mark.parametrize(
    ("aggregator", "field"),
    [("centred_clip", "centred_clip_iterations"), ("geometric_median", "geomed_max_iter")],
)
def test_the_aggregators_passes_are_counted(aggregator: str, field: str) -> None:
    """600 rounds x 10 updates x 1,663,370 CNN values x 10,000 passes = 9.98e13
    values, at 1e9 a second 99,802 s: 1.2 days; one pass is 10 s."""
    robust = {"robust.aggregator": aggregator, f"robust.{field}": 10_000}
    cfg = override(Config(), {"rounds": 600, **robust})
    line = workload_warning(cfg, MNIST_IID, params=1_663_370)
    assert line is not None and "\n" not in line
    assert f"robust.{field} 10000" in line and "9.98e+13" in line and "1.2 days" in line
    assert workload_warning(override(cfg, {f"robust.{field}": 1}), MNIST_IID, 0, 1_663_370) is None


def test_per_fedavgs_meta_steps_are_counted() -> None:
    """60 rounds x 10 clients x 10,000 meta-steps x 3 batches of 10 = 1.8e8
    examples, at the CNN's 1,500 a second 1.39 days (one epoch would be 6,000
    examples a client: 2.4 hours)."""
    cfg = override(Config(), {"algorithm": "perfedavg", "perfedavg.steps": 10_000})
    line = workload_warning(cfg, MNIST_IID)
    assert line is not None and "1.8e+08 examples" in line and "1.4 days" in line


def test_personalised_evaluation_steps_are_counted() -> None:
    """60 evaluations x 10,000 steps x 100 clients' batches of 10 = 6e8 examples,
    at 1,500 a second 4.6 days."""
    cfg = override(
        Config(),
        {
            "evaluation.clients": True,
            "evaluation.personal.steps": 10_000,
            "evaluation.personal.lr": 0.01,
        },
    )
    line = workload_warning(cfg, MNIST_IID)
    assert line is not None and "evaluation.personal.steps 10000" in line and "4.6 days" in line

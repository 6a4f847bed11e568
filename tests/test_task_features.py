"""Every algorithm, aggregator, codec, privacy and robust feature runs on a task
other than image classification: the linear-regression task (real-valued targets,
squared error, R^2) trained with each, scored against what the least-squares fit
reaches. Features that need something the task lacks are refused in one line."""

from __future__ import annotations

import pytest

import fedforge as ff
from fedforge.config import Config, EvaluationConfig, override
from fedforge.core.errors import ConfigError

BASE = Config(
    task="linear-regression",
    num_clients=10,
    client_fraction=0.5,
    local_epochs=1,
    batch_size=20,
    lr=0.05,
    rounds=25,
    target_accuracy=None,
    evaluation=EvaluationConfig(every=25),
    engine="serial",
)


@pytest.mark.parametrize(
    "fields",
    [
        {"algorithm": "fedprox", "fedprox.mu": 0.1},
        {"algorithm": "scaffold"},
        {"algorithm": "perfedavg", "perfedavg": {"alpha": 0.01, "steps": 10}},
        {"algorithm": "fedsgd", "lr": 0.4},
        {"server_optimizer": {"kind": "adam", "lr": 0.1}},
        {"robust": {"aggregator": "median"}},
        {"robust": {"aggregator": "krum"}},
        {"robust": {"aggregator": "geometric_median"}},
        {"communication": {"uplink": "int8"}},
        {"communication": {"uplink": "topk", "fraction": 0.5, "error_feedback": True}},
        {"privacy": {"secagg": True}, "communication": {"clip_norm": 10.0}},
        {"privacy": {"dp": "central", "noise_multiplier": 0.01, "clip_norm": 5.0}},
        {"aggregation": {"weights": "quality"}},
        {"engine": "vectorized"},
    ],
    ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()),
)
def test_each_feature_fits_a_regression(fields: dict[str, object]) -> None:
    cfg = override(BASE, fields)
    result = ff.run(cfg, store=False)
    r2 = result.rounds[-1].test_accuracy
    # the noise of the targets (std 0.1 over coefficients ~ N(0, 1) on 20 features)
    # caps R^2 near 0.9995; 25 rounds of any of these features get most of the way
    assert r2 is not None and r2 > 0.9, r2


def test_fedbn_on_a_model_without_batch_norm_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        ff.run(override(BASE, {"algorithm": "fedbn"}), store=False)
    assert "batch norm" in str(info.value) and "\n" not in str(info.value)

"""Issue 4 part B.4: aggregation weights of the weighted mean, by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from tests.conftest import MakeData

from fedforge.aggregation.mean import WeightedMean
from fedforge.aggregation.weights import Reweighted, client_weight
from fedforge.client.runtime import ClientTask, encode_payload
from fedforge.config import from_dict
from fedforge.core import wire
from fedforge.core.errors import ConfigError
from fedforge.server.experiment import build
from fedforge.server.loop import run

F64 = torch.float64
U = torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]], dtype=F64)
N = torch.tensor([1.0, 4.0, 16.0], dtype=F64)


@pytest.mark.parametrize(
    ("rule", "cap", "w"),
    [
        ("num_examples", None, [1.0, 4.0, 16.0]),
        ("uniform", None, [1.0, 1.0, 1.0]),
        ("sqrt", None, [1.0, 2.0, 4.0]),
        ("capped", 4, [1.0, 4.0, 4.0]),
    ],
)
def test_rules_gathered_and_streaming_equal_the_hand_mean(
    rule: Any, cap: int | None, w: list[float]
) -> None:
    want = sum(wk * u for wk, u in zip(w, U, strict=True)) / sum(w)
    agg = Reweighted(WeightedMean(), rule, cap)
    assert torch.allclose(agg.aggregate(U, N), want)
    acc = agg.start(2, F64)
    for u, n in zip(U, N.tolist(), strict=True):
        acc.add(u, n)
    assert acc.count == 3 and torch.allclose(acc.result(), want)
    assert [client_weight(rule, n, cap) for n in N.tolist()] == w


def test_uniform_example_by_hand() -> None:
    # uniform: (1 + 0 + 3) / 3 and (0 + 1 + 3) / 3
    got = Reweighted(WeightedMean(), "uniform").aggregate(U, N)
    assert torch.allclose(got, torch.tensor([4 / 3, 4 / 3], dtype=F64))
    assert client_weight("sqrt", 2.0) == pytest.approx(math.sqrt(2))


BASE: dict[str, Any] = {
    "model": "logreg",
    "num_clients": 4,
    "client_fraction": 1.0,
    "batch_size": 8,
    "lr": 0.05,
    "rounds": 1,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


def test_config_refusals_and_run(make_data: MakeData, one_thread: None) -> None:
    with pytest.raises(ConfigError, match="aggregation.weight_cap"):
        from_dict({**BASE, "aggregation": {"weights": "capped"}})
    data = make_data([5, 9, 30, 2], dtype=F64)
    with pytest.raises(ConfigError, match="weighs updates its own way"):
        build(
            from_dict(
                {**BASE, "aggregation": {"weights": "uniform"}, "robust": {"aggregator": "median"}}
            ),
            data,
        )
    with pytest.raises(ConfigError, match="privacy.weights"):
        build(
            from_dict({**BASE, "aggregation": {"weights": "sqrt"}, "privacy": {"dp": "central"}}),
            data,
        )
    # one round, E = 1, full cohort: uniform differs from num_examples by the weights only
    plain = run(from_dict(BASE), data=data, store=False)
    uniform = run(
        from_dict({**BASE, "aggregation": {"weights": "uniform"}}), data=data, store=False
    )
    exp = build(from_dict(BASE), data)
    runtime = exp.engine.runtime  # type: ignore[attr-defined]
    payload = encode_payload(exp.initial_params, 0)
    deltas = [
        wire.decode(runtime.run(ClientTask(c, 0, exp.algorithm.plan(0), 0), payload)).tensors[
            "delta"
        ]
        for c in range(4)
    ]
    n = [5.0, 9.0, 30.0, 2.0]
    by_n = exp.initial_params + sum(w * d for w, d in zip(n, deltas, strict=True)) / sum(n)
    by_1 = exp.initial_params + sum(deltas) / 4
    assert torch.allclose(plain.params, by_n, atol=1e-12)
    assert torch.allclose(uniform.params, by_1, atol=1e-12)
    assert not torch.equal(plain.params, uniform.params)
    assert torch.isfinite(uniform.params).all() and exp.pipeline.aggregator.name == "weighted_mean"
    assert build(
        from_dict({**BASE, "aggregation": {"weights": "sqrt"}}), data
    ).pipeline.aggregator.name == ("weighted_mean[sqrt]")

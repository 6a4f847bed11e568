"""The examples q-FedAvg, a norm-filtered mean, signSGD with majority vote and
FedExP (examples/*.py, written on the public API), each against one round worked by
hand from the paper's equations in plain torch (float64), on the serial and
the vectorised engine, with signSGD's uplink bytes as the run store records them."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fedforge
from examples_loaded import load_example
from fedforge.config import from_dict
from fedforge.core import registry, wire
from fedforge.data.federated import FederatedData
from fedforge.data.partition import Partition
from fedforge.store import RunStore

F64 = torch.float64
D, C = 3, 2  # features, classes of the logistic regression
SIZES = (1, 2, 3)  # examples a client
LR, EPOCHS = 0.5, 2
BOUNDS = np.cumsum([0, *SIZES])
PARTS = tuple(np.arange(BOUNDS[k], BOUNDS[k + 1]) for k in range(len(SIZES)))


@pytest.fixture(scope="module")
def examples() -> Iterator[dict[str, Any]]:
    loaded = {n: load_example(n) for n in ("qfedavg", "norm_filtered_mean", "signsgd", "fedexp")}
    yield loaded
    for kind, name in [
        ("algorithm", "qfedavg"),
        ("algorithm", "fedexp"),
        ("aggregator", "norm_filtered_mean"),
        ("aggregator", "majority_vote"),
        ("codec", "signsgd"),
    ]:
        registry.unregister(kind, name)


def _data(scale_last: float = 1.0) -> FederatedData:
    gen = torch.Generator().manual_seed(7)
    n = sum(SIZES)
    x = torch.randn(n, D, generator=gen, dtype=F64)
    x[n - SIZES[-1] :] *= scale_last  # the last client's features, larger
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    return FederatedData(x, y, x, y, Partition(PARTS), num_classes=C)


def _cfg(tmp_path: Path, engine: str, **extra: Any) -> fedforge.Config:
    fields = {
        "dataset": "synthetic",
        "model": "logreg",
        "num_clients": len(SIZES),
        "client_fraction": 1.0,
        "local_epochs": EPOCHS,
        "batch_size": None,  # full batch: local SGD is gradient descent, worked below
        "lr": LR,
        "rounds": 1,
        "target_accuracy": None,
        "dtype": "float64",
        "engine": engine,
        "runs_dir": str(tmp_path / engine),
        **extra,
    }
    return from_dict(fields)


def _run(tmp_path: Path, engine: str, data: FederatedData, **extra: Any) -> fedforge.RunResult:
    return fedforge.run(_cfg(tmp_path, engine, **extra), data=data)


def _initial(tmp_path: Path, data: FederatedData, **extra: Any) -> torch.Tensor:
    return fedforge.build(_cfg(tmp_path, "serial", **extra), data=data).initial_params.clone()


# ------------------------------------------------------------ the paper's equations


def _loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    weight, bias = w[: C * D].view(C, D), w[C * D :]
    return F.cross_entropy(x @ weight.T + bias, y)


def _local(w0: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """EPOCHS full-batch gradient steps of size LR from w0."""
    w = w0.clone()
    for _ in range(EPOCHS):
        leaf = w.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(_loss(leaf, x, y), leaf)
        w = w - LR * grad
    return w


def _clients(data: FederatedData) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(data.train_x[idx], data.train_y[idx]) for idx in PARTS]


def _qfedavg_round(w0: torch.Tensor, data: FederatedData, q: float, big_l: float) -> torch.Tensor:
    """Li et al. 2020, Algorithm 2, one round over every client."""
    deltas, hs = [], []
    for x, y in _clients(data):
        f = float(_loss(w0, x, y))
        dw = big_l * (w0 - _local(w0, x, y))
        deltas.append(f**q * dw)
        hs.append(q * f ** (q - 1) * float(dw @ dw) + big_l * f**q)
    return w0 - torch.stack(deltas).sum(0) / sum(hs)


QFEDAVG = {"aggregation": {"weights": "uniform"}}
NO_GATES = {"max_norm_multiple": None, "max_update_ratio": None}


@pytest.mark.parametrize(("q", "lipschitz"), [(2.0, None), (0.5, 3.0)])
def test_qfedavg_is_one_hand_worked_round(
    examples: dict[str, Any], tmp_path: Path, q: float, lipschitz: float | None
) -> None:
    data = _data()
    extra = {
        **QFEDAVG,
        "algorithm": "qfedavg",
        "robust": NO_GATES,
        "plugin_options": {"qfedavg": {"q": q, "L": lipschitz}},
    }
    w0 = _initial(tmp_path, data, **extra)
    expected = _qfedavg_round(w0, data, q, 1 / LR if lipschitz is None else lipschitz)
    serial = _run(tmp_path, "serial", data, **extra)
    torch.testing.assert_close(serial.params, expected, rtol=0, atol=1e-12)
    assert not serial.rejected and not serial.skipped


def test_qfedavg_runs_serially_when_vectorised_is_asked_and_says_so(
    examples: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data()
    extra = {**QFEDAVG, "algorithm": "qfedavg", "robust": NO_GATES}
    serial = _run(tmp_path, "serial", data, **extra)
    capsys.readouterr()
    vector = _run(tmp_path, "vectorized", data, **extra)
    torch.testing.assert_close(vector.params, serial.params, rtol=0, atol=1e-9)
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "vectorized cannot" in ln]
    assert line.endswith("; serial")


def test_qfedavg_with_q_0_is_fedavg_with_uniform_weights(
    examples: dict[str, Any], tmp_path: Path
) -> None:
    data = _data()
    plain = _run(tmp_path / "a", "serial", data, **QFEDAVG)
    q0 = {"algorithm": "qfedavg", "plugin_options": {"qfedavg": {"q": 0.0}}}
    fair = _run(tmp_path / "b", "serial", data, **QFEDAVG, **q0)
    torch.testing.assert_close(fair.params, plain.params, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "needs aggregation.weights: uniform and robust.aggregator: mean"),
        (
            {**QFEDAVG, "plugin_options": {"qfedavg": {"q": -1.0}}},
            r"'plugin_options.qfedavg.q' = -1.0 is invalid: must be >= 0",
        ),
        (
            {"aggregation": {"weights": "uniform"}, "robust": {"aggregator": "mean"}},
            "with q > 0 scales the updates of high-loss clients .*max_norm_multiple: null",
        ),
    ],
)
def test_qfedavg_refuses_what_it_cannot_run_in_one_line(
    examples: dict[str, Any], tmp_path: Path, extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(fedforge.ConfigError, match=message) as info:
        _run(tmp_path, "serial", _data(), algorithm="qfedavg", **extra)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------ norm-filtered mean


def test_norm_filtered_mean_leaves_out_the_large_update(
    examples: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = _data(scale_last=30.0)
    w0 = _initial(tmp_path, data)
    deltas = torch.stack([_local(w0, x, y) - w0 for x, y in _clients(data)])
    norms = deltas.norm(dim=1)
    median = float(norms.sort().values[1])  # the middle of three
    keep = norms <= 1.5 * median
    assert keep.tolist() == [True, True, False]  # the hand example leaves out the third
    n = torch.tensor(SIZES, dtype=F64) * keep
    expected = w0 + (n @ deltas) / n.sum()
    extra = {
        "robust": {"aggregator": "norm_filtered_mean", **NO_GATES},
        "plugin_options": {"norm_filtered_mean": {"multiple": 1.5}},
    }
    with caplog.at_level(logging.WARNING):
        serial = _run(tmp_path, "serial", data, **extra)
    torch.testing.assert_close(serial.params, expected, rtol=0, atol=1e-12)
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("norm_filtered_mean: left out 1 of 3 updates")
    vector = _run(tmp_path, "vectorized", data, **extra)
    torch.testing.assert_close(vector.params, serial.params, rtol=0, atol=1e-9)


def test_norm_filtered_mean_refuses_a_multiple_below_one(examples: dict[str, Any]) -> None:
    with pytest.raises(fedforge.ConfigError, match="multiple = 0.5 must be >= 1"):
        fedforge.build(
            from_dict(
                {
                    "dataset": "synthetic",
                    "model": "logreg",
                    "robust": {"aggregator": "norm_filtered_mean"},
                    "plugin_options": {"norm_filtered_mean": {"multiple": 0.5}},
                }
            )
        )


# ------------------------------------------------------------ signSGD, majority vote


def test_signsgd_majority_vote_is_one_hand_worked_round_in_bits(
    examples: dict[str, Any], tmp_path: Path
) -> None:
    data, step = _data(), 0.01
    w0 = _initial(tmp_path, data)
    signs = []
    for x, y in _clients(data):
        delta = _local(w0, x, y) - w0
        signs.append(torch.where(delta >= 0, 1.0, -1.0).to(F64))  # a zero votes +1
    expected = w0 + step * torch.sign(torch.stack(signs).sum(0))
    extra = {
        "communication": {"uplink": "signsgd"},
        "robust": {"aggregator": "majority_vote"},
        "plugin_options": {"majority_vote": {"step": step}},
    }
    results = {e: _run(tmp_path, e, data, **extra) for e in ("serial", "vectorized")}
    for result in results.values():
        assert torch.equal(result.params, expected)

    size = w0.numel()  # 8 parameters: one byte of signs a client
    assert result.run_dir is not None
    with RunStore.open(result.run_dir) as store:
        records = store.client_rounds(0)
    assert len(records) == len(SIZES)
    for rec in records:
        meta = {
            "codec": "signsgd",
            "client_id": rec.client_id,
            "round_idx": 0,
            "num_examples": rec.num_examples,
            "train_loss": rec.train_loss,
            "steps": EPOCHS,
        }
        by_hand = len(
            wire.encode({"signs": torch.zeros(math.ceil(size / 8), dtype=torch.uint8)}, meta)
        )
        assert rec.bytes_up == by_hand


def test_signsgd_sends_one_bit_a_parameter(examples: dict[str, Any]) -> None:
    codec = examples["signsgd"].SignCodec()
    delta = torch.tensor([0.5, -2.0, 0.0, -1e-9, 3.0, -0.1, 7.0, -7.0, 1.0, -1.0], dtype=F64)
    tensors, meta = codec.encode(delta)
    assert tensors["signs"].tolist() == [0b01010101, 0b01]  # first sign in the lowest bit
    decoded = codec.decode(tensors, meta, delta.numel(), F64)
    assert decoded.tolist() == [1, -1, 1, -1, 1, -1, 1, -1, 1, -1]
    bad = {"signs": torch.tensor([0b01010101, 0b101], dtype=torch.uint8)}
    with pytest.raises(fedforge.UploadError, match="non-zero padding bits"):
        codec.decode(bad, meta, delta.numel(), F64)


# ------------------------------------------------------------ FedExP


@pytest.mark.parametrize("eps", [1e-3, 10.0])  # eta_g above 1, and held at 1
def test_fedexp_is_one_hand_worked_round(
    examples: dict[str, Any], tmp_path: Path, eps: float
) -> None:
    """Jhunjhunwala et al. 2023, Algorithm 1: eta_g = max(1, sum ||D_i||^2 /
    (2 M (||mean D||^2 + eps))), w <- w + eta_g mean D."""
    data = _data()
    w0 = _initial(tmp_path, data)
    deltas = torch.stack([_local(w0, x, y) - w0 for x, y in _clients(data)])
    mean = deltas.mean(0)
    eta = max(1.0, float((deltas**2).sum()) / (2 * len(SIZES) * (float(mean @ mean) + eps)))
    assert (eta > 1) == (eps < 1)  # the two cases the parameters are for
    extra = {
        "algorithm": "fedexp",
        "aggregation": {"weights": "uniform"},
        "plugin_options": {"fedexp": {"eps": eps}},
    }
    serial = _run(tmp_path, "serial", data, **extra)
    torch.testing.assert_close(serial.params, w0 + eta * mean, rtol=0, atol=1e-12)
    vector = _run(tmp_path, "vectorized", data, **extra)
    torch.testing.assert_close(vector.params, serial.params, rtol=0, atol=1e-9)

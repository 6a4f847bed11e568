"""examples/fednova.py and examples/feddyn.py against the papers' equations:
one hand-worked federation (a linear model of 3 weights, 3 clients of 1-3
examples), its rounds recomputed here in plain torch (float64); FedDyn's client
state across a resume; both on the vectorised engine as on the serial one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fedforge
from conftest import RunStopped
from fedforge.config import from_dict, override
from fedforge.core.errors import ConfigError
from fedforge.core.registry import load_plugin
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run
from fedforge.store import RunStore

F64 = torch.float64
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LR = 0.1


class Linear3(nn.Module):
    """Two-class logits (0, w . x): logistic regression with 3 weights."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(3, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.w(x)
        return torch.cat([torch.zeros_like(z), z], dim=1)


# client k holds n_k copies of one example, so that the order of its minibatches
# cannot matter: with B = 1 it takes E n_k steps (tau = 1, 2, 3 for E = 1)
EXAMPLE_X = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.8, -1.0], [-1.5, 0.2, 2.0]], dtype=F64)
EXAMPLE_Y = torch.tensor([1, 0, 1])
SIZES = (1, 2, 3)


def _data() -> fedforge.FederatedData:
    rows = [k for k, n in enumerate(SIZES) for _ in range(n)]
    x, y = EXAMPLE_X[rows], EXAMPLE_Y[rows]
    starts = [sum(SIZES[:k]) for k in range(len(SIZES))]
    parts = tuple(torch.arange(s, s + n).numpy() for s, n in zip(starts, SIZES, strict=True))
    return fedforge.FederatedData(x, y, EXAMPLE_X, EXAMPLE_Y, fedforge.Partition(parts))


BASE: dict[str, Any] = {
    "model": "examples_linear3",
    "num_clients": 3,
    "client_fraction": 1.0,
    "local_epochs": 1,
    "batch_size": 1,
    "lr": LR,
    "rounds": 1,
    "target_accuracy": None,
    "dtype": "float64",
    "engine": "serial",
    "diagnostics": {"updates": False},
    "robust": {"max_norm_multiple": None},
}


@pytest.fixture(scope="module", autouse=True)
def plugins() -> Iterator[None]:
    fedforge.register_model("examples_linear3", Linear3)
    load_plugin(str(EXAMPLES / "fednova.py"))  # imported once a process: stays registered
    load_plugin(str(EXAMPLES / "feddyn.py"))
    yield


def _cfg(tmp_path: Path, **extra: Any) -> Any:
    return from_dict({**BASE, "runs_dir": str(tmp_path), **extra})


def _loss_grad(w: torch.Tensor, k: int) -> torch.Tensor:
    """The gradient of client k's example's cross-entropy at w, from scratch."""
    w = w.detach().clone().requires_grad_(True)
    z = EXAMPLE_X[k] @ w
    logits = torch.stack([torch.zeros((), dtype=F64), z])
    loss = nn.functional.cross_entropy(logits.unsqueeze(0), EXAMPLE_Y[k : k + 1])
    (g,) = torch.autograd.grad(loss, w)
    return g


def _initial(cfg: Any) -> torch.Tensor:
    return build(cfg, _data()).initial_params.clone()


def _used(run_dir: Path, round_idx: int) -> list[int]:
    with RunStore.open(run_dir, read_only=True) as store:
        return sorted(c.client_id for c in store.client_rounds(round_idx))


# ----------------------------------------------------------------------------- FedNova


def _fednova_round(w: torch.Tensor, clients: list[int], momentum: float) -> torch.Tensor:
    """Wang et al. 2020, eq. (6)-(7): each client's SGD (heavy ball as torch.optim.SGD),
    d_i = (w - w_i) / a_i with a_i = sum_k (1 - rho^k) / (1 - rho), tau_eff = sum p_i a_i,
    w+ = w - tau_eff sum p_i d_i."""
    n = torch.tensor([float(SIZES[k]) for k in clients], dtype=F64)
    p = n / n.sum()
    d, a = [], []
    for k in clients:
        wk, buf = w.clone(), None
        for _ in range(SIZES[k]):
            g = _loss_grad(wk, k)
            buf = g if buf is None else momentum * buf + g
            wk = wk - LR * buf
        tau = SIZES[k]
        a_k = sum(sum(momentum**j for j in range(s)) for s in range(1, tau + 1))
        a.append(a_k)
        d.append((w - wk) / a_k)
    tau_eff = float((p * torch.tensor(a, dtype=F64)).sum())
    return w - tau_eff * sum(pi * di for pi, di in zip(p, d, strict=True))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fednova_is_normalised_averaging_on_a_hand_worked_round(
    tmp_path: Path, momentum: float
) -> None:
    cfg = _cfg(tmp_path, algorithm="fednova", local={"momentum": momentum})
    got = run(cfg, _data())
    assert not got.rejected and not got.skipped
    want = _fednova_round(_initial(cfg), [0, 1, 2], momentum)
    assert torch.allclose(got.params, want, rtol=0, atol=1e-12)
    fedavg = run(override(cfg, {"algorithm": "fedavg", "runs_dir": str(tmp_path / "a")}), _data())
    assert (got.params - fedavg.params).abs().max() > 1e-3  # tau differs: not FedAvg


def test_fednova_refuses_weights_it_does_not_normalise(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="algorithm 'fednova' weighs clients by their examples"):
        build(_cfg(tmp_path, algorithm="fednova", aggregation={"weights": "uniform"}), _data())


# ----------------------------------------------------------------------------- FedDyn

ALPHA = 0.5


def _feddyn_rounds(w: torch.Tensor, cohorts: list[list[int]], m: int) -> torch.Tensor:
    """Acar et al. 2021, Algorithm 1: each local step of client k is
    w' <- w' - lr (grad L_k(w') - g_k + alpha (w' - w)); then g_k, h and w as the paper."""
    grads = {k: torch.zeros_like(w) for k in range(m)}
    h = torch.zeros_like(w)
    for cohort in cohorts:
        finals = {}
        for k in cohort:
            wk = w.clone()
            for _ in range(SIZES[k]):
                wk = wk - LR * (_loss_grad(wk, k) - grads[k] + ALPHA * (wk - w))
            finals[k] = wk
            grads[k] = grads[k] - ALPHA * (wk - w)
        h = h - ALPHA / m * sum(finals[k] - w for k in cohort)
        w = sum(finals.values()) / len(cohort) - h / ALPHA
    return w


def _dyn_cfg(tmp_path: Path, **extra: Any) -> Any:
    return _cfg(
        tmp_path,
        algorithm="feddyn",
        aggregation={"weights": "uniform"},
        plugin_options={"feddyn": {"alpha": ALPHA}},
        **extra,
    )


def test_feddyn_follows_algorithm_1_over_rounds_with_partial_cohorts(tmp_path: Path) -> None:
    cfg = _dyn_cfg(tmp_path, client_fraction=0.67, rounds=3, seed=3)  # 2 of 3 a round
    got = run(cfg, _data())
    assert got.run_dir is not None and not got.rejected and not got.skipped
    cohorts = [_used(got.run_dir, r) for r in range(3)]
    assert all(len(c) == 2 for c in cohorts) and len({tuple(c) for c in cohorts}) > 1
    want = _feddyn_rounds(_initial(cfg), cohorts, m=3)
    assert torch.allclose(got.params, want, rtol=0, atol=1e-12)


def test_feddyn_refuses_a_weighted_mean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="algorithm 'feddyn' averages the clients' models"):
        build(_cfg(tmp_path, algorithm="feddyn"), _data())


def test_feddyn_resumes_bit_identical(tmp_path: Path, run_stopped: RunStopped) -> None:
    cfg = _dyn_cfg(tmp_path / "a", client_fraction=0.67, rounds=3, checkpoint_every=1)
    reference = run(cfg, _data())
    stopped = run_stopped(override(cfg, {"runs_dir": str(tmp_path / "b")}), _data(), 1)
    assert stopped.stopped == "SIGTERM" and len(stopped.rounds) == 2
    assert not torch.equal(stopped.params, reference.params)
    resumed = resume(stopped.run_dir, data=_data())
    assert len(resumed.rounds) == 3
    assert torch.equal(resumed.params, reference.params)


# ----------------------------------------------------------------------------- engines


@pytest.mark.parametrize("algorithm", ["fednova", "feddyn"])
def test_the_vectorised_engine_equals_the_serial_one(tmp_path: Path, algorithm: str) -> None:
    extra: dict[str, Any] = {"algorithm": algorithm, "rounds": 2, "local": {"momentum": 0.5}}
    if algorithm == "feddyn":
        extra |= {
            "aggregation": {"weights": "uniform"},
            "plugin_options": {"feddyn": {"alpha": 0.3}},
        }
    serial = run(_cfg(tmp_path / "s", **extra), _data())
    vectorised = run(_cfg(tmp_path / "v", engine="vectorized", **extra), _data())
    assert vectorised.summary["engine"] == "vectorized"
    assert torch.allclose(vectorised.params, serial.params, rtol=0, atol=1e-9)
    assert not torch.equal(serial.params, _initial(_cfg(tmp_path / "i", **extra)))


@pytest.mark.parametrize("name", ["fednova", "feddyn"])
def test_the_example_configs_read_with_their_plugin(name: str) -> None:
    import yaml

    cfg = from_dict(yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()))
    assert cfg.algorithm == name and cfg.dataset == "mnist"


def test_update_scalars_are_taken_and_other_shapes_refused(tmp_path: Path) -> None:
    from fedforge.core.errors import UploadError
    from fedforge.server.collectors.intake import check_extras

    exp = build(_cfg(tmp_path, algorithm="fednova"), _data())
    scalars = {"n_a": torch.tensor([6.0], dtype=F64), "n": torch.tensor([2.0], dtype=F64)}
    assert check_extras(exp, dict(scalars)) == scalars
    with pytest.raises(UploadError, match=r"'n_a' must be \(3,\) or \(1,\) torch.float64"):
        check_extras(exp, {**scalars, "n_a": torch.ones(2, dtype=F64)})

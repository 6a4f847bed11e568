"""Server optimizers (Reddi et al. 2021) against hand computations and against
torch.optim fed the same pseudo-gradients."""

from __future__ import annotations

import math

import pytest
import torch

from fedforge.config import Config, ServerOptimizerConfig
from fedforge.core.errors import ConfigError
from fedforge.server.optimizers import ServerAdaptive, ServerSGD, from_config


def deltas(steps: int, size: int = 7, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=gen, dtype=torch.float64) for _ in range(steps)]


def test_fedadam_with_bias_correction_is_torch_adam() -> None:
    x0 = torch.linspace(-1, 1, 7, dtype=torch.float64)
    ours = ServerAdaptive("adam", lr=0.03, beta1=0.9, beta2=0.99, tau=1e-3, bias_correction=True)
    ref = x0.clone().requires_grad_(True)
    adam = torch.optim.Adam([ref], lr=0.03, betas=(0.9, 0.99), eps=1e-3)
    x = x0.clone()
    for d in deltas(6):
        x = ours.step(x, d)
        ref.grad = -d  # the pseudo-gradient
        adam.step()
        assert torch.allclose(x, ref.detach(), atol=1e-14, rtol=0)


def test_fedyogi_with_bias_correction_first_step_by_hand() -> None:
    """From v = 0: v_1 = (1 - b2) d^2 and m_1 = (1 - b1) d; corrected, both are
    d^2 and d, so the first step is lr d / (|d| + tau), as Adam's. (Only m was
    corrected: a step ~10x larger, lr sign(d) / sqrt(1 - b2).)"""
    d = torch.tensor([0.1, -0.05, 0.2], dtype=torch.float64)
    want = 0.01 * d / (d.abs() + 1e-3)
    for kind in ("yogi", "adam"):
        opt = ServerAdaptive(kind, lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3, bias_correction=True)
        step = opt.step(torch.zeros(3, dtype=torch.float64), d)
        assert torch.allclose(step, want, rtol=1e-12, atol=0), kind


def test_paper_form_by_hand() -> None:
    """Two steps of FedAdam, FedAdagrad and FedYogi on a scalar, worked by hand
    with v_{-1} = tau^2 and no bias correction."""
    b1, b2, tau, lr = 0.9, 0.99, 0.1, 1.0
    d1, d2 = 0.5, -0.2
    m1 = (1 - b1) * d1
    m2 = b1 * m1 + (1 - b1) * d2
    v_adam1 = b2 * tau**2 + (1 - b2) * d1**2
    v_adam2 = b2 * v_adam1 + (1 - b2) * d2**2
    v_ada1 = tau**2 + d1**2
    v_ada2 = v_ada1 + d2**2
    # yogi: v1 = tau^2 - (1-b2) d1^2 sign(tau^2 - d1^2); tau^2 = 0.01 < 0.25 -> sign -1
    v_yogi1 = tau**2 + (1 - b2) * d1**2
    v_yogi2 = v_yogi1 - (1 - b2) * d2**2 * math.copysign(1, v_yogi1 - d2**2)
    for kind, v1, v2 in (
        ("adam", v_adam1, v_adam2),
        ("adagrad", v_ada1, v_ada2),
        ("yogi", v_yogi1, v_yogi2),
    ):
        opt = ServerAdaptive(kind, lr=lr, beta1=b1, beta2=b2, tau=tau)  # type: ignore[arg-type]
        x = torch.zeros(1, dtype=torch.float64)
        x = opt.step(x, torch.tensor([d1], dtype=torch.float64))
        x1 = lr * m1 / (math.sqrt(v1) + tau)
        assert x.item() == pytest.approx(x1, abs=1e-15), kind
        x = opt.step(x, torch.tensor([d2], dtype=torch.float64))
        assert x.item() == pytest.approx(x1 + lr * m2 / (math.sqrt(v2) + tau), abs=1e-15), kind


def test_fedavgm_is_sgd_with_momentum() -> None:
    x0 = torch.linspace(0, 1, 7, dtype=torch.float64)
    ours = ServerSGD(lr=0.7, momentum=0.9)
    ref = x0.clone().requires_grad_(True)
    sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9)
    x = x0.clone()
    for d in deltas(5, seed=1):
        x = ours.step(x, d)
        ref.grad = -d
        sgd.step()
    assert torch.allclose(x, ref.detach(), atol=1e-14, rtol=0)


@pytest.mark.parametrize("kind", ["adagrad", "adam", "yogi"])
def test_state_round_trip_continues_exactly(kind: str) -> None:
    ds = deltas(6, seed=2)
    a = ServerAdaptive(kind, lr=0.1)  # type: ignore[arg-type]
    x = torch.zeros(7, dtype=torch.float64)
    for d in ds[:3]:
        x = a.step(x, d)
    b = ServerAdaptive(kind, lr=0.1)  # type: ignore[arg-type]
    b.load_state_dict(a.state_dict())
    xa, xb = x.clone(), x.clone()
    for d in ds[3:]:
        xa, xb = a.step(xa, d), b.step(xb, d)
    assert torch.equal(xa, xb)


def test_from_config_and_validation() -> None:
    cfg = Config(server_optimizer=ServerOptimizerConfig(kind="yogi", lr=0.01, tau=1e-2))
    opt = from_config(cfg)
    assert isinstance(opt, ServerAdaptive) and opt.kind == "yogi" and opt.tau == 1e-2
    assert isinstance(from_config(Config()), ServerSGD)
    with pytest.raises(ConfigError, match="server_optimizer.beta2"):
        Config(server_optimizer=ServerOptimizerConfig(beta2=1.0))
    with pytest.raises(ConfigError, match="server_optimizer.kind"):
        from fedforge.config import override

        override(Config(), {"server_optimizer.kind": "lamb"})

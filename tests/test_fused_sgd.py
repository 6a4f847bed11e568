"""A fully connected layer's backward with its SGD step (fused_sgd.linear_step):
the input gradient with the weights before the step and W - lr G^T X, computed
by hand in float64, on each of its three kernels."""

from __future__ import annotations

import pytest
import torch

from fedforge.client import fused_sgd
from fedforge.client.fused_sgd import linear_step


def _layer(out: int, inp: int, rows: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(out, inp, generator=gen, dtype=torch.float64)
    b = torch.randn(out, generator=gen, dtype=torch.float64)
    x = torch.randn(rows, inp, generator=gen, dtype=torch.float64)
    g = torch.randn(rows, out, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (w, b, x, g))


def _by_hand(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, g: torch.Tensor, lr: float):  # type: ignore[no-untyped-def]
    w, b, x, g = (t.double() for t in (w, b, x, g))
    return g @ w, w - lr * g.t() @ x, b - lr * g.sum(dim=0)


def test_blocked_step_by_hand_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_sgd, "BLOCK_FLOATS", 6)  # 2 rows a block: 3 blocks
    w, b, x, g = _layer(5, 3, 4, torch.float64)
    grad_in, w_new, b_new = _by_hand(w, b, x, g, 0.1)
    out = linear_step(x, g, w, b, 0.1, True)
    torch.testing.assert_close(out, grad_in, rtol=0, atol=1e-12)  # with W before the step
    torch.testing.assert_close(w, w_new, rtol=0, atol=1e-12)
    torch.testing.assert_close(b, b_new, rtol=0, atol=1e-12)
    assert linear_step(x, g, w, b, 0.1, False) is None  # no input gradient asked


@pytest.mark.parametrize("onednn", [True, False])
def test_float32_step_of_a_large_layer(monkeypatch: pytest.MonkeyPatch, onednn: bool) -> None:
    """McMahan's fc1 at B = 10: oneDNN's input gradient (where torch has it) or
    the blocked BLAS products, both equal to the float64 result to float32 rounding."""
    monkeypatch.setattr(fused_sgd, "_ONEDNN", onednn and fused_sgd._ONEDNN)
    w, b, x, g = _layer(512, 3136, 10, torch.float32)
    grad_in, w_new, b_new = _by_hand(w, b, x, g, 0.05)
    out = linear_step(x, g, w, b, 0.05, True)
    assert out is not None and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), grad_in, rtol=1e-5, atol=1e-3)  # sums of 512
    torch.testing.assert_close(w.double(), w_new, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.double(), b_new, rtol=1e-6, atol=1e-6)


def test_bf16_step_updates_the_master_and_refreshes_the_copy() -> None:
    """``precision: bf16``: the input gradient on the bf16 copy (as autocast's),
    the step on the fp32 weights with the fp32 product of the bf16 operands, the
    copy their rounding after."""
    w, b, x, g = _layer(300, 700, 10, torch.float32)
    half, x16, g16 = w.to(torch.bfloat16), x.to(torch.bfloat16), g.to(torch.bfloat16)
    w0, b0, half0 = w.clone(), b.clone(), half.clone()
    out = linear_step(x16, g16, w, b, 0.05, True, half)
    assert out is not None and out.dtype == torch.bfloat16
    want_in = g16.double() @ half0.double()
    torch.testing.assert_close(out.double(), want_in, rtol=2**-7, atol=1e-2)
    grad_w = g16.double().t() @ x16.double()  # not rounded to bf16
    torch.testing.assert_close(w.double(), w0.double() - 0.05 * grad_w, rtol=0, atol=2e-6)
    grad_b = g16.double().sum(0)
    torch.testing.assert_close(b.double(), b0.double() - 0.05 * grad_b, atol=2e-6, rtol=0)
    assert torch.equal(half, w.to(torch.bfloat16))  # refreshed: what a cast would give
    assert not torch.equal(half, half0)

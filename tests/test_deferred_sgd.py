"""A fully connected layer's SGD with deferred weight steps (deferred_sgd.py)
against the step-by-step update written out here: float64 to 1e-12 at every
step, bf16 to its rounding; and that the steps are really deferred."""

from __future__ import annotations

import pytest
import torch

from fedforge.client import deferred_sgd
from fedforge.client.deferred_sgd import DeferredLinear
from fedforge.client.fused_sgd import linear_step

LR = 0.1


def _batches(sizes: list[int], dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    draw = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    return [(draw(n, 30), draw(n, 20)) for n in sizes]


def _layer(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    return torch.randn(20, 30, generator=gen, dtype=dtype), torch.randn(
        20, generator=gen, dtype=dtype
    )


# 8 steps of 10 rows fill FOLD_ROWS = 80 exactly; 7 does not divide it; 100 exceeds it
SIZES = [10] * 9 + [3, 7, 7, 100, 10]


def test_float64_equals_the_step_by_step_update() -> None:
    weight, bias = _layer(torch.float64)
    start = weight.clone()
    layer = DeferredLinear(weight, bias, LR, torch.float64)
    w, b = start.clone(), bias.clone()  # the update step by step: SGD's definition
    rows = 0
    for n, (x, g) in zip(SIZES, _batches(SIZES, torch.float64), strict=True):
        torch.testing.assert_close(layer.forward(x), x @ w.T + b, rtol=0, atol=1e-12)
        got = layer.backward_step(x, g, True)
        torch.testing.assert_close(got, g @ w, rtol=0, atol=1e-12)  # weights before the step
        w, b = w - LR * g.T @ x, b - LR * g.sum(dim=0)
        torch.testing.assert_close(bias, b, rtol=0, atol=1e-12)  # the bias steps at once
        rows += n
        if rows >= deferred_sgd.FOLD_ROWS:
            torch.testing.assert_close(weight, w, rtol=0, atol=1e-12)  # folded in
            rows = 0
        else:
            assert layer.rows == rows
    assert layer.rows > 0 and not torch.allclose(weight, w)  # the last steps still deferred
    layer.fold()
    torch.testing.assert_close(weight, w, rtol=0, atol=1e-12)
    assert (w - start).abs().max() > 1  # it trained, far beyond the tolerance
    assert layer.backward_step(*_batches([4], torch.float64)[0], False) is None


def test_a_fold_every_eight_steps_of_ten_rows() -> None:
    weight, bias = _layer(torch.float64)
    start = weight.clone()
    layer = DeferredLinear(weight, bias, LR, torch.float64)
    for step, (x, g) in enumerate(_batches([10] * 9, torch.float64), start=1):
        layer.backward_step(x, g, False)
        moved = not torch.equal(weight, start)
        assert moved == (step >= 8), step  # steps 1-7 kept as factors, folded at 8
        assert layer.rows == (10 if step == 9 else 10 * step % 80)


def test_bf16_agrees_with_the_step_by_step_bf16_update() -> None:
    """The same inputs and output gradients through fused_sgd.linear_step's bf16
    path (a bf16 copy of the weights refreshed every step): the forward and input
    gradient differ by bf16 rounding (the copy's, against the thin products'),
    the fp32 weights by fp32 rounding (the same fp32 products, summed at once)."""
    weight, bias = _layer(torch.float32)
    w, b = weight.clone(), bias.clone()
    half = w.to(torch.bfloat16)
    layer = DeferredLinear(weight, bias, LR, torch.bfloat16)
    for x, g in _batches([10] * 12, torch.float32):
        x, g = x.to(torch.bfloat16), g.to(torch.bfloat16)
        want = torch.addmm(b.to(torch.bfloat16), x, half.t()).float()
        got = layer.forward(x).float()
        assert (got - want).abs().max() <= 2**-6 * want.abs().max()
        want_input = linear_step(x, g, w, b, LR, True, half)
        got_input = layer.backward_step(x, g, True)
        assert got_input is not None and want_input is not None
        assert (got_input - want_input).float().abs().max() <= 2**-6 * want_input.abs().max()
    layer.fold()
    assert (w - _layer(torch.float32)[0]).abs().max() > 1  # it trained
    torch.testing.assert_close(weight, w, rtol=0, atol=1e-5)
    torch.testing.assert_close(bias, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_fold_with_nothing_deferred_changes_nothing(dtype: torch.dtype) -> None:
    weight, bias = _layer(torch.float64 if dtype == torch.float64 else torch.float32)
    before = weight.clone()
    DeferredLinear(weight, bias, LR, dtype).fold()
    assert torch.equal(weight, before)

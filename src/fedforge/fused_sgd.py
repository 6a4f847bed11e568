"""Plain SGD folded into the backward pass of fully connected layers.

At B = 10 a large fully connected layer is paid in memory traffic, not in
arithmetic: McMahan's CNN's fc1 (512 x 3136, 6.4 MB) does 16M multiply-adds a
step against ~6 passes over its weights (forward, input gradient, gradient
written, gradient and weights read by the optimizer, weights written), and the
weights do not fit in a core's L2 cache. Measured with the profiler (one thread,
torch 2.13): the optimizer's ``add_`` was 10% of a B = 10 step and 1% at B = 100.

Here the layer's backward applies its own step, ``W <- W - lr G^T X`` (one
``addmm_``: the gradient is never written), and walks the weights in blocks of
rows small enough to stay in L2 between the two products that read them (the
input gradient ``G W`` and the update). Four passes instead of six, mostly in
cache.

Same maths as ``torch._foreach_add_(params, grads, alpha=-lr)`` after the
backward: a layer's input gradient uses its weights before the step, and no
other gradient reads them. So it needs plain SGD (no momentum, decay, clipping
or algorithm hook: they need the whole gradient first), fp32 or float64 (not
under bf16 autocast), and a model where each such layer is called once per
forward on a 2-D input that carries a gradient (the layer is not the first):
that is known per architecture (:data:`FUSED_LAYERS`), not guessed. Equal to
the unfused step to rounding; the engines' float64 equivalence tests cover it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from fedforge.algorithms.base import LocalPlan
from fedforge.models.layout import Conv2d
from fedforge.models.mnist import MnistCNN

# Architectures whose fully connected layers may take the fused step, by name
# (each called once per forward, after a layer with trainable parameters).
FUSED_LAYERS: dict[type[nn.Module], tuple[str, ...]] = {MnistCNN: ("fc1", "fc2")}
BLOCK_FLOATS = 200_000  # 800 KB of fp32 weight rows: stays in a 1.25 MB L2


def linear_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x W^T + b``, the fused layers' forward product (looked up at each call:
    benchmarks/cnn_per_client_cost.py measures another kernel in its place)."""
    return torch.addmm(bias, x, weight.t())


class _LinearSGD(torch.autograd.Function):
    """``x W^T + b`` whose backward returns the input gradient and steps W, b."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        lr: float,
    ) -> torch.Tensor:
        ctx.save_for_backward(x)
        # Not saved tensors: the step writes them during this very backward, and
        # they are views of one flat vector whose version counter every step bumps.
        ctx.weight, ctx.bias, ctx.lr = weight, bias, lr  # type: ignore[attr-defined]
        return linear_product(x, weight, bias)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None]:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        weight, bias, lr = ctx.weight, ctx.bias, ctx.lr  # type: ignore[attr-defined]
        want_input = ctx.needs_input_grad[0]  # type: ignore[attr-defined]
        grad_input = x.new_zeros(x.shape) if want_input else None
        rows = max(1, BLOCK_FLOATS // weight.shape[1])
        for lo in range(0, weight.shape[0], rows):
            g, w = grad[:, lo : lo + rows], weight[lo : lo + rows]
            if grad_input is not None:
                grad_input.addmm_(g, w)  # with the weights before the step
            w.addmm_(g.t(), x, alpha=-lr)
        bias.add_(grad.sum(dim=0), alpha=-lr)
        return grad_input, None, None, None


class _SGDLinear(nn.Linear):
    """An ``nn.Linear`` that steps itself in backward at ``lr`` (the class a
    layer has only inside :func:`sgd_in_backward`, which sets ``lr``)."""

    lr: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or not x.requires_grad:  # the layer would not be trained
            raise RuntimeError(
                f"fused SGD needs a 2-D input carrying a gradient, got shape "
                f"{tuple(x.shape)} (requires_grad={x.requires_grad}); see FUSED_LAYERS"
            )
        out: torch.Tensor = _LinearSGD.apply(x, self.weight, self.bias, self.lr)
        return out


def fused_layers(model: nn.Module, plan: LocalPlan, hook: object, state: object) -> tuple[str, ...]:
    """The layers of ``model`` that take the fused step under ``plan`` (empty:
    none, the ordinary step)."""
    layers = FUSED_LAYERS.get(type(model), ())
    if not layers or hook is not None or state or not plan.plain or plan.precision != "fp32":
        return ()
    if any(isinstance(m, Conv2d) and not m.channels_last for m in model.modules()):
        # NCHW convolutions save views of the flat vector for their backward; the
        # in-place step of a fused layer would change that vector under them
        # (channels_last saves a copy: models/layout.py)
        return ()
    return layers


@contextlib.contextmanager
def sgd_in_backward(model: nn.Module, layers: tuple[str, ...], lr: float) -> Iterator[None]:
    """Within: ``layers`` of ``model`` step themselves in backward at ``lr``."""
    modules = [model.get_submodule(name) for name in layers]
    for m in modules:
        if type(m) is not nn.Linear or m.bias is None:
            raise TypeError(f"layer {m!r} is not a plain nn.Linear with a bias")
    try:
        for m in modules:
            m.__class__ = _SGDLinear
            m.lr = lr  # type: ignore[assignment]
        yield
    finally:
        for m in modules:
            m.__class__ = nn.Linear
            del m.lr

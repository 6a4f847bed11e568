"""Plain SGD folded into the backward of a fully connected layer.

At B = 10 a large fully connected layer is paid in memory traffic, not in
arithmetic: McMahan's CNN's fc1 (512 x 3136, 6.4 MB) does 16M multiply-adds a
step against ~6 passes over its weights when autograd and an optimizer run it
(forward, input gradient, gradient written, gradient and weights read by the
optimizer, weights written), and the weights do not fit in a core's L2 cache.

:func:`linear_step` is the layer's backward with its own step,
``W <- W - lr G^T X``, one rank-B product added into the weights: the gradient
is never written. Same maths as ``torch._foreach_add_(params, grads, alpha=-lr)``
after the backward: the layer's input gradient uses its weights before the step,
and no other gradient reads them; so it needs plain SGD (no momentum, decay,
clipping or algorithm hook: they need the whole gradient first). The CNN's
written-out step (cnn_step.py) calls it for fc1 and fc2, but for fc1 under
bf16, whose steps it defers (deferred_sgd.py).

Which kernels, measured here (docs/changelog.md): in float32 the input gradient
goes through oneDNN's inner product, about twice as fast as the BLAS product
at 10 rows; in float64 (no oneDNN) the weights are walked in blocks of rows
small enough to stay in L2 between the two products that read them. Under
``precision: bf16`` the forward and the input gradient run on a bf16 copy of
the weights that the step refreshes, and the weight gradient is an fp32
product (more exact than autocast's bf16 one, and 1.09x the step's speed).
"""

from __future__ import annotations

import torch

BLOCK_FLOATS = 200_000  # 800 KB of fp32 weight rows: stays in a 1 MB L2

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _inner_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x W^T`` through oneDNN's inner product (float32)."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    return out


def linear_step(
    x: torch.Tensor,
    grad: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    lr: float,
    want_input: bool,
    half: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """The backward of ``x W^T + b`` with its SGD step: the input gradient (with
    the weights before the step, if ``want_input``), ``W <- W - lr G^T X``.

    ``half``: a bf16 copy of ``weight`` (``precision: bf16``) that the forward
    used. The input gradient is a bf16 product on it, as autocast's; the weight
    and bias gradients are computed in fp32 from the bf16 ``x`` and ``grad``
    (exact conversions of B rows) and added into the fp32 ``weight`` and ``bias``
    (autocast would round them to bf16 first, and write and read the weight
    gradient once more); then the copy is refreshed, so the next forward need
    not cast the layer again."""
    if half is not None:
        grad_input = torch.mm(grad, half) if want_input else None
        x, grad = x.to(weight.dtype), grad.to(weight.dtype)
        weight.addmm_(grad.t(), x, alpha=-lr)  # one rank-B product into the weights
    elif _ONEDNN and weight.dtype == torch.float32 and weight.numel() >= BLOCK_FLOATS:
        # oneDNN's inner product computes G W at 10 rows about twice as fast as
        # the BLAS product (measured here, docs/changelog.md)
        grad_input = _inner_product(grad, weight.t()) if want_input else None
        weight.addmm_(grad.t(), x, alpha=-lr)
    else:  # float64, small layers
        grad_input = _blocked_step(x, grad, weight, lr, want_input)
    bias.add_(grad.sum(dim=0), alpha=-lr)
    if half is not None:
        half.copy_(weight)
    return grad_input


def _blocked_step(
    x: torch.Tensor, grad: torch.Tensor, weight: torch.Tensor, lr: float, want_input: bool
) -> torch.Tensor | None:
    """The input gradient and the weights' step with BLAS products, walking the
    weights in row blocks that stay in L2 between the two products reading them."""
    grad_input = x.new_zeros(x.shape) if want_input else None
    rows = max(1, BLOCK_FLOATS // weight.shape[1])
    for lo in range(0, weight.shape[0], rows):
        g, w = grad[:, lo : lo + rows], weight[lo : lo + rows]
        if grad_input is not None:
            grad_input.addmm_(g, w)  # with the weights before the step
        w.addmm_(g.t(), x, alpha=-lr)
    return grad_input

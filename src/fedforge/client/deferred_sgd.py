"""Plain SGD on a large fully connected layer with its weight steps deferred:
kept as their rank-B factors and added into the weights several steps at once.

An SGD step on ``x W^T + b`` moves the weights by ``-lr G^T X``: the product of
the step's B inputs ``X`` and output gradients ``G``, rank B. Until it is added
in, the layer with the moved weights is still computed exactly from the
factors: ``x W_t^T = x W^T - lr (x X^T) G`` and ``G' W_t = G' W - lr (G' G^T) X``,
two thin products each. :class:`DeferredLinear` keeps the factors of up to
``FOLD_ROWS`` rows of steps, then adds them in with one product of that rank.

Why (``precision: bf16``, measured here, docs/changelog.md): at B = 10 rows a
step of McMahan's CNN's fc1 (512 x 3136) is paid in memory traffic: its fp32
master weights (6.4 MB) read and written and their bf16 copy written every
step cost about as much as its bf16 forward and input gradient together.
Deferred, the weights are read and written once every ``FOLD_ROWS / B``
steps, by a product of ``FOLD_ROWS`` rows that runs near the CPU's peak.

The arithmetic is SGD's: every forward and input gradient sees the weights with
every earlier step in them (float64: equal to the step-by-step update to
1e-12, tests/test_deferred_sgd.py). In bf16 the forward and input gradient
and the thin products on the factors are bf16 products, as autocast's are, the
deferred steps' term entering the main product's accumulation so that the
output is rounded once (rounded twice, the forward's error was 1.3x the
step-by-step update's); the weight gradient is an fp32 product of the bf16
factors, added into the fp32 weights (fused_sgd.linear_step's semantics).
"""

from __future__ import annotations

import torch

FOLD_ROWS = 80  # rows of deferred steps: 8 steps at B = 10


class DeferredLinear:
    """``x W^T + b`` trained by plain SGD at rate ``lr``, its products in
    ``dtype`` (bf16, or the weights' own for an exact check). ``bias`` takes
    each step at once; ``weight`` takes the deferred ones at each :meth:`fold`,
    which the caller runs after the last step."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor, lr: float, dtype: torch.dtype
    ) -> None:
        self.weight, self.bias, self.lr, self.dtype = weight, bias, lr, dtype
        # the weights as of the last fold, in ``dtype`` (a copy even in the
        # weights' own dtype, so the float64 check covers its refresh)
        self.copy = weight.to(dtype, copy=True)
        self.rows = 0  # rows of deferred steps
        self.inputs = weight.new_empty((FOLD_ROWS, weight.shape[1]), dtype=dtype)
        self.grads = weight.new_empty((FOLD_ROWS, weight.shape[0]), dtype=dtype)

    def _factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[: self.rows], self.grads[: self.rows]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x W_t^T + b``, ``W_t`` the weights with every step so far."""
        bias = self.bias.to(self.dtype)
        if self.rows:  # the deferred steps' term with the bias, then one product on
            inputs, grads = self._factors()  # it: the output is rounded once
            bias = torch.addmm(bias, torch.mm(x, inputs.t()), grads, alpha=-self.lr)
        return torch.addmm(bias, x, self.copy.t())

    def backward_step(
        self, x: torch.Tensor, grad: torch.Tensor, want_input: bool
    ) -> torch.Tensor | None:
        """The backward of :meth:`forward` on input ``x``: the input gradient
        (with the weights before this step, if ``want_input``), then the step."""
        grad_input = None
        if want_input and self.rows:
            inputs, grads = self._factors()
            deferred = torch.mm(torch.mm(grad, grads.t()), inputs)
            grad_input = torch.addmm(deferred, grad, self.copy, alpha=1.0, beta=-self.lr)
        elif want_input:
            grad_input = torch.mm(grad, self.copy)
        self.bias.add_(grad.to(self.bias.dtype).sum(dim=0), alpha=-self.lr)
        end = self.rows + len(x)
        if end > len(self.inputs):  # B does not divide FOLD_ROWS, or exceeds it
            self.inputs, self.grads = (
                _grown(self.inputs, self.rows, end),
                _grown(self.grads, self.rows, end),
            )
        self.inputs[self.rows : end] = x
        self.grads[self.rows : end] = grad
        self.rows = end
        if self.rows >= FOLD_ROWS:
            self.fold()
        return grad_input

    def fold(self) -> None:
        """Add the deferred steps into the weights: one fp32 product of their rank."""
        if self.rows:
            inputs, grads = self._factors()
            dtype = self.weight.dtype
            self.weight.addmm_(grads.t().to(dtype), inputs.to(dtype), alpha=-self.lr)
            self.copy.copy_(self.weight)
            self.rows = 0


def _grown(buffer: torch.Tensor, keep: int, rows: int) -> torch.Tensor:
    """``buffer`` with room for ``rows`` rows, its first ``keep`` rows kept."""
    out = buffer.new_empty((rows, buffer.shape[1]))
    out[:keep] = buffer[:keep]
    return out

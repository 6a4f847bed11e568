"""Clients never seen in training, under a model with batch norm (FedBN's
generalisation question, Li et al. 2021): such a client has no batch-norm
entries of its own. It can use the global ones, or recompute the running
statistics on its own data, the affine parameters left as they are.

The recomputed statistics are exact: each batch norm's running mean and
running variance become the mean and the unbiased variance (what torch's
``running_var`` stores) of each channel of that layer's input over ALL of the
client's examples (for a convolution's batch norm: over examples and spatial
positions), whatever ``batch_size`` is. Per-batch figures are not averaged
(torch's ``momentum=None`` would count a short last batch as much as a full
one, and give the mean of the batches' variances, not the variance of the data).

How: one batch norm at a time, in the order the forward pass reaches them, with
the model in eval mode (no gradient, no dropout). A pass over the data stops at
the first batch norm whose statistics are not yet recomputed and merges its
input's per-channel count, mean and sum of squared deviations batch by batch in
float64 (Chan et al.'s pairwise update, no cancellation); the result is written
into that layer before the next pass. Every layer upstream of a batch norm thus
already runs with its recomputed statistics, so each layer's statistics are of
the inputs it sees when the client is evaluated (eval mode), and no batch
boundary enters any figure. Passes: one per batch norm, each stopping at it.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedforge.core.params import ParamSpec

F64 = torch.float64


class _Reached(Exception):
    """Raised by the hook once the batch norm being recomputed has its input."""


class _Moments:
    """Per-channel count, mean and sum of squared deviations (M2) of the batches
    seen so far, in float64; merged batch by batch (Chan, Golub and LeVeque 1979)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self.mean: torch.Tensor | None = None
        self.m2: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> None:
        """Merge a batch norm's input ``x`` (channels on dimension 1)."""
        c = x.shape[1]
        v = x.detach().to(F64).transpose(0, 1).reshape(c, -1)
        k = v.shape[1]
        if k == 0:
            return
        mean = v.mean(1)
        m2 = ((v - mean.unsqueeze(1)) ** 2).sum(1)
        if self.mean is None or self.m2 is None:
            self.n, self.mean, self.m2 = k, mean, m2
            return
        n = self.n + k
        delta = mean - self.mean
        self.mean = self.mean + delta * (k / n)
        self.m2 = self.m2 + m2 + delta**2 * (self.n * k / n)
        self.n = n


def recomputed_statistics(
    model: nn.Module, spec: ParamSpec, params: torch.Tensor, x: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """``params`` with every batch norm's running mean and variance replaced by the
    exact per-channel mean and unbiased variance of its input over all of ``x``
    (the module docstring says how); nothing else of the vector moves, and
    ``model`` is left as it was. ``batch_size`` bounds memory only: the result
    does not depend on it beyond float64 rounding."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if len(x) == 0:
        raise ValueError("no examples to recompute batch-norm statistics on")
    norms: list[_BatchNorm] = [
        m
        for m in model.modules()
        if isinstance(m, _BatchNorm) and m.running_mean is not None and m.running_var is not None
    ]
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    was_training = model.training
    pending = {id(m): m for m in norms}
    target: list[_BatchNorm] = []
    moments = _Moments()

    def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if id(module) not in pending:
            return  # already recomputed: it normalises with its new statistics
        if not target:
            target.append(pending[id(module)])  # the first batch norm the pass reaches
        elif module is not target[0]:
            raise RuntimeError(
                "recomputed_statistics: the forward pass reached its batch norms "
                "in a different order from one batch to the next"
            )
        moments.add(args[0])
        raise _Reached

    handles = [m.register_forward_pre_hook(hook) for m in norms]
    try:
        spec.load_into(model, params)
        model.eval()
        with torch.no_grad():
            while pending:
                target.clear()
                moments.reset()
                for i in range(0, len(x), batch_size):
                    with contextlib.suppress(_Reached):
                        model(x[i : i + batch_size])
                if not target:
                    break  # the rest are never reached: they keep what params held
                bn = target[0]
                if moments.mean is None or moments.m2 is None or moments.n < 2:
                    raise ValueError(
                        "recomputed_statistics: a batch norm needs at least two values "
                        f"a channel for an unbiased variance, got {moments.n}"
                    )
                assert bn.running_mean is not None and bn.running_var is not None
                bn.running_mean.copy_(moments.mean.to(bn.running_mean.dtype))
                bn.running_var.copy_((moments.m2 / (moments.n - 1)).to(bn.running_var.dtype))
                del pending[id(bn)]
        return spec.flatten(model, params.dtype)
    finally:
        for h in handles:
            h.remove()
        model.load_state_dict(saved)
        model.train(was_training)

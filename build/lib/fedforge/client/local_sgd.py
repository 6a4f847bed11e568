"""Local training: one client's minibatch SGD from a start vector, the step the
algorithms' hooks adjust, and the results brought back to the host. The serial
engine runs it as is; the vectorised engine batches the same steps.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.func import functional_call

from fedforge.algorithms.base import LocalPlan, LossFn
from fedforge.algorithms.local import (
    GradHook,
    LocalResult,
    LocalStep,
)
from fedforge.client import cnn_step
from fedforge.core import rows
from fedforge.core.device import HOST
from fedforge.core.params import ParamSpec
from fedforge.core.precision import forward_context


def minibatches(
    num_examples: int, batch_size: int | None, gen: torch.Generator
) -> list[torch.Tensor]:
    """One epoch's minibatch indices: a permutation from ``gen`` cut into batches of
    ``batch_size`` (the last one may be smaller); ``None`` means one full batch.
    No examples, no batch (an empty one would still take a weight-decay step)."""
    if num_examples == 0:
        return []
    perm = torch.randperm(num_examples, generator=gen)
    size = num_examples if batch_size is None else batch_size
    return list(perm.split(size))


def local_sgd(
    model: nn.Module,
    spec: ParamSpec,
    start: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    plan: LocalPlan,
    loss_fn: LossFn,
    gen: torch.Generator,
    hook: GradHook | None = None,
    state: Mapping[str, torch.Tensor] | None = None,
) -> LocalResult:
    """``plan.local_epochs`` epochs of minibatch SGD from ``start``, on the device
    of ``start``, ``x`` and ``y`` (the minibatch order is drawn on the host).

    ``model`` only gives the architecture: its own tensors are never read or
    written; the parameters live in one flat vector updated in place. McMahan's
    CNN under plain SGD takes its written-out step (cnn_step.py: the same
    arithmetic without autograd). Plain SGD without a ``hook`` takes the fast
    path (one ``_foreach_add_``); otherwise each
    step is :class:`~fedforge.algorithms.local.LocalStep` on ``[1, ...]`` views,
    the very code the vectorised engine runs on ``[K, ...]`` (``state``: the
    client's ``[1, P]`` tensors prepared by the algorithm, e.g. SCAFFOLD's c - c_k).
    """
    params = start.clone()
    if cnn_step.applies(model, plan, loss_fn, hook, state, params.dtype):
        total, seen, steps = cnn_step.cnn_sgd(
            spec.views(params), x, y, plan, lambda: minibatches(len(y), plan.batch_size, gen)
        )
        return LocalResult(params, total / max(seen, 1), steps)
    leaves, tensors = _leaves(spec, params)
    step = _local_step(spec, params, start, plan, hook, state)
    model.train()
    device = params.device
    total_loss = 0.0
    seen = 0
    steps = 0
    for _ in range(plan.local_epochs):
        batches = minibatches(len(y), plan.batch_size, gen)
        if device != HOST:  # drawn on the host: the indices go to the data
            batches = [idx.to(device) for idx in batches]
        for idx in batches:
            with forward_context(plan.precision, device.type):
                logits = functional_call(model, leaves, (rows.take(x, idx),))
            loss = loss_fn(logits.to(params.dtype), rows.take(y, idx)).mean()
            grads = torch.autograd.grad(loss, tensors)
            if step is not None:
                step([g.unsqueeze(0) for g in grads])
            else:
                with torch.no_grad():
                    torch._foreach_add_(tensors, grads, alpha=-plan.lr)
            total_loss += loss.detach().item() * len(idx)
            seen += len(idx)
            steps += 1
    return LocalResult(params, total_loss / max(seen, 1), steps)


def on_host(result: LocalResult) -> LocalResult:
    """``result`` with its parameters on the host, where the client's upload
    pipeline runs (the same result when they are there already)."""
    if result.params.device == HOST:
        return result
    return LocalResult(result.params.to(HOST), result.train_loss, result.steps)


def _leaves(
    spec: ParamSpec, params: torch.Tensor
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The named leaf tensors of ``params`` for ``functional_call``, and the
    trainable ones among them (in spec order) for autograd.

    They are views of the flat vector: in-place steps on them update ``params``
    directly, and autograd gives one gradient per tensor. Buffers (batch-norm
    running statistics) are views too, without gradient: the forward pass
    updates them in place, straight into the flat vector."""
    train = {e.name for e in spec.entries if e.trainable}
    leaves = {
        k: v.detach().requires_grad_(True) if k in train else v.detach()
        for k, v in spec.views(params).items()
    }
    return leaves, [v for k, v in leaves.items() if k in train]


def _local_step(
    spec: ParamSpec,
    params: torch.Tensor,
    start: torch.Tensor,
    plan: LocalPlan,
    hook: GradHook | None,
    state: Mapping[str, torch.Tensor] | None,
) -> LocalStep | None:
    """The general step on ``[1, ...]`` views of ``params``, or None for plain
    SGD without a hook (the fast path: one ``_foreach_add_``)."""
    if hook is None and plan.plain:
        return None
    batched = trainable_views(spec, params.unsqueeze(0))
    anchor = trainable_views(spec, start.unsqueeze(0))
    per_client = {k: trainable_views(spec, v) for k, v in (state or {}).items()}
    return LocalStep(plan, batched, anchor, per_client, hook)


def trainable_views(spec: ParamSpec, vec: torch.Tensor) -> list[torch.Tensor]:
    """The named views of ``vec`` for the entries gradients move, in spec order."""
    views = spec.views(vec)
    return [views[e.name] for e in spec.entries if e.trainable]

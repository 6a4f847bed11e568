"""Batched matrix products for perceptrons: the vectorised engine's fast path
for chains of linear layers with ReLU between them (McMahan et al. 2017's
2NN, multinomial logistic regression).

``torch.func.vmap`` over autograd pays, at every step, for tracing the batched
graph and for K per-client gradient tensors that are written once and read
once by the update. Here the K clients' forward and backward passes are written
out as batched matrix products over the stacked ``[K, out, in]`` weights, and
each SGD step is fused into the weight-gradient product:

    W_k <- W_k - lr * G_k^T H_k        one ``baddbmm_`` for all k,

where H_k is client k's input to the layer and G_k the loss gradient at its
output, so no gradient tensor is ever materialised. Measured here (one thread,
2NN, K = 10, B = 10): about 5x the vmap path (docs/results.md).

The maths is the serial engine's (``client.local_sgd``): for the mean
cross-entropy over a client's minibatch of n_k examples, the gradient at the
logits is (softmax(z) - onehot(y)) / n_k per example; back through a layer it
is G W, through ReLU it is masked by h > 0. Minibatches and padding come from
the same schedule as the vmap path; finished clients drop out of the products, so both
engines (and the serial one) agree to 1e-9 in float64 (tests/test_vectorized.py).

Two algorithm terms are folded into the same update: FedProx's proximal
gradient mu (W - W_t) and SCAFFOLD's correction c - c_k (both added to every
gradient, as their hooks do on the other paths):

    W_k <- (1 - lr mu) W_k + lr mu W_t - lr (G^T H_k + c - c_k).

It applies to plain SGD (no momentum, weight decay or clipping), no hook or one
of those two, the cross-entropy loss and fp32/float64: :func:`mlp_layers`,
:func:`fused_terms` and :func:`applies` decide; everything else takes the vmap
path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedforge.algorithms.base import Algorithm, LocalPlan, cross_entropy
from fedforge.algorithms.fedprox import ProximalTerm
from fedforge.algorithms.scaffold import CORRECTION, Correction
from fedforge.client.runtime import LocalResult
from fedforge.core.params import ParamSpec
from fedforge.models.logreg import LogisticRegression
from fedforge.models.mnist import MnistMLP


def mlp_layers(model: nn.Module) -> list[str] | None:
    """The names of ``model``'s linear layers in order, ReLU between each pair
    (None: not such a chain, or a frozen parameter the fused step would move).
    Known by type, not guessed from the modules."""
    if not all(p.requires_grad for p in model.parameters()):
        return None
    if isinstance(model, MnistMLP):
        return ["fc1", "fc2", "fc3"]
    if isinstance(model, LogisticRegression):
        return ["fc"]
    return None


@dataclass(frozen=True)
class Terms:
    """The algorithm terms of the fused update: FedProx's mu, SCAFFOLD's c - c_k."""

    mu: float = 0.0
    correction: torch.Tensor | None = None  # [K, P]


def fused_terms(hook: object, state: Mapping[str, torch.Tensor] | None) -> Terms | None:
    """The terms an algorithm's gradient hook adds, or None when the fused path
    cannot compute them (an unknown hook, or client state it does not use)."""
    keys = set(state or {})
    if hook is None and not keys:
        return Terms()
    if isinstance(hook, ProximalTerm) and not keys:
        return Terms(mu=hook.mu)
    if isinstance(hook, Correction) and keys == {CORRECTION} and state is not None:
        return Terms(correction=state[CORRECTION])
    return None


def fits(model: nn.Module, algorithm: Algorithm, plan: LocalPlan) -> bool:
    """The model, loss and plan the fused path computes (its algorithm terms aside)."""
    return (
        mlp_layers(model) is not None
        and algorithm.loss_fn is cross_entropy
        and plan.plain
        and plan.precision == "fp32"
    )


def applies(
    model: nn.Module,
    algorithm: Algorithm,
    plan: LocalPlan,
    state: Mapping[str, torch.Tensor] | None,
) -> bool:
    """True when the fused path computes exactly what local SGD would."""
    return fits(model, algorithm, plan) and fused_terms(algorithm.grad_hook, state) is not None


def batched_mlp_sgd(
    layers: Sequence[str],
    spec: ParamSpec,
    start: torch.Tensor,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    index: torch.Tensor,
    mask: torch.Tensor,
    lr: float,
    terms: Terms | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K clients' local SGD from ``start`` over the steps ``index [S, K, W]``
    (rows of ``x_all``/``y_all``; ``mask`` marks real rows), with ``terms``
    added to every gradient. Returns the final parameters ``[K, P]`` and each
    client's summed training loss (float64)."""
    terms = terms or Terms()
    k = index.shape[1]
    # Clients with more steps first: at step s only the first live[s] clients
    # still train, so the products run on a prefix of the stacked weights (a
    # view) instead of padding finished clients (quantity skew made whole
    # chunks wait on their largest client). Every client starts from ``start``,
    # so the order changes nothing but which rows are computed; it is undone
    # at the end.
    order = torch.argsort(mask.any(dim=2).sum(dim=0), descending=True, stable=True)
    index, mask = index[:, order], mask[:, order]
    live = mask.any(dim=2).sum(dim=1).tolist()  # [S]: clients still training
    anchor = spec.views(start.unsqueeze(0))  # W_t, [1, ...]
    w0 = [anchor[f"{name}.weight"] for name in layers]
    b0 = [anchor[f"{name}.bias"] for name in layers]
    # The clients' weights, one contiguous [K, out, in] tensor a layer (updated in
    # place): an in-place batched product into views of the [K, P] parameters
    # (batch stride P) goes through a temporary, ~1.4x the update's time here.
    # (repeat, not expand().contiguous(): for K = 1 that would be start itself.)
    weights = [w.repeat(k, 1, 1) for w in w0]
    biases = [b.repeat(k, 1) for b in b0]  # [K, out]
    shrink = 1.0 - lr * terms.mu
    corr_w: list[torch.Tensor] = []
    corr_b: list[torch.Tensor] = []
    if terms.correction is not None:
        corr = spec.views(terms.correction[order].to(start.dtype))
        corr_w = [corr[f"{name}.weight"] for name in layers]
        corr_b = [corr[f"{name}.bias"] for name in layers]
    x_flat = x_all.reshape(x_all.shape[0], -1)
    # Each step's rows, client by client: the live clients' rows are a prefix.
    width = index.shape[2]
    flat_index = index.reshape(index.shape[0], k * width)  # (no -1: a chunk may have no step)
    # Per-step constants, made once for the chunk instead of once a step (at
    # B = 10 a step's products are small and every extra op shows): the scale
    # of d(mean loss)/dz (1/n_k on a client's real rows, 0 on padding), the
    # labels, the softmax gradient's -1, and where each step's log p(label) goes.
    dtype = start.dtype
    counts = mask.sum(dim=2, keepdim=True).clamp(min=1).to(dtype)  # [S, K, 1]
    scale = (mask.to(dtype) / counts).unsqueeze(3)  # [S, K, W, 1]
    labels = y_all[index].unsqueeze(3)  # [S, K, W, 1]
    minus_one = torch.full((k, index.shape[2], 1), -1.0, dtype=dtype)
    picked = torch.zeros(index.shape, dtype=dtype)  # log p(label), [S, K, W]
    last = len(layers) - 1
    a_views = -1
    for step in range(index.shape[0]):
        a = live[step]
        if a != a_views:  # the live clients' rows of the stacked tensors (views)
            ws, bs = [w[:a] for w in weights], [b[:a] for b in biases]
            wts, bcols = [w.transpose(1, 2) for w in ws], [b.unsqueeze(1) for b in bs]
            cws, cbs = [c[:a] for c in corr_w], [c[:a] for c in corr_b]
            a_views = a
        rows = flat_index[step, : a * width]
        h = x_flat.index_select(0, rows).view(a, width, x_flat.shape[1])  # [a, W, in]
        inputs = []
        for i in range(last + 1):
            inputs.append(h)
            h = torch.baddbmm(bcols[i], h, wts[i])
            if i < last:
                h = h.relu_()
        y = labels[step, :a]  # [a, W, 1]
        logp = torch.log_softmax(h, dim=2)
        picked[step, :a] = logp.gather(2, y).squeeze(2)
        grad = logp.exp_()  # softmax
        grad.scatter_add_(2, y, minus_one[:a])
        grad.mul_(scale[step, :a])  # d(mean loss)/dz, zero on padded rows
        for i in range(last, -1, -1):
            below = torch.bmm(grad, ws[i]) if i > 0 else None  # before W moves
            if terms.mu:  # - lr mu (W - W_t)
                ws[i].mul_(shrink).add_(w0[i], alpha=lr * terms.mu)
                bs[i].mul_(shrink).add_(b0[i], alpha=lr * terms.mu)
            if cws:  # - lr (c - c_k)
                ws[i].add_(cws[i], alpha=-lr)
                bs[i].add_(cbs[i], alpha=-lr)
            ws[i].baddbmm_(grad.transpose(1, 2), inputs[i], alpha=-lr)
            bs[i].add_(grad.sum(dim=1), alpha=-lr)
            if below is not None:  # through the ReLU of layer i - 1, as autograd does
                grad = torch.ops.aten.threshold_backward(below, inputs[i], 0.0)
    loss_sum = -(picked.to(torch.float64) * mask).sum(dim=(0, 2))  # real rows only
    params = start.expand(k, -1).clone()  # in the callers' order: row order[j] is w[j]
    views = spec.views(params)
    for name, w, b in zip(layers, weights, biases, strict=True):
        views[f"{name}.weight"].index_copy_(0, order, w)
        views[f"{name}.bias"].index_copy_(0, order, b)
    return params, loss_sum[torch.argsort(order)]


def results(
    params: torch.Tensor, loss_sum: torch.Tensor, schedules: Sequence[Sequence[torch.Tensor]]
) -> list[LocalResult]:
    """One LocalResult per client: its parameters, mean training loss and steps."""
    seen = [sum(len(b) for b in s) for s in schedules]
    return [
        LocalResult(params[i].clone(), float(loss_sum[i]) / max(seen[i], 1), len(s))
        for i, s in enumerate(schedules)
    ]

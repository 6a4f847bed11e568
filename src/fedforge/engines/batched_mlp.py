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
2NN, K = 10, B = 10): about 5x the vmap path (docs/changelog.md).

The maths is the serial engine's (``client.local_sgd``): for the mean
cross-entropy over a client's minibatch of n_k examples, the gradient at the
logits is (softmax(z) - onehot(y)) / n_k per example; back through a layer it
is G W, through ReLU it is masked by h > 0. Minibatches and padding come from
the same schedule as the vmap path; finished clients drop out of the products, so both
engines (and the serial one) agree to 1e-9 in float64 (tests/test_vectorized.py).

An algorithm's gradient term is folded into the same update when its hook
declares it linear (``algorithms.local.LinearTerm``: a proximal pull
p (W - W_t) and a per-client constant shift s_k, such as FedProx's mu (W - W_t)
and SCAFFOLD's c - c_k), as the hook adds it to every gradient on the other paths:

    W_k <- (1 - lr p) W_k + lr p W_t - lr (G^T H_k + s_k).

Clients with their own learning rates (``local.lr_rule``) share a chunk: client
k's lr is folded into its logits' gradient, lr_k G, which every product below
is linear in, and the terms take it per client.

The model takes it when it declares its chain of layers
(``models.perceptron``). It is a CPU path (its chunks are sized to the cores'
caches): a model on another device takes the vmap path. It applies to plain
SGD (no momentum, weight decay or clipping), a hook that declares its term (or
none), the cross-entropy loss and fp32/float64: :func:`mlp_layers`,
:func:`fused_terms` and :func:`applies` decide; everything else takes the vmap path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedforge.algorithms.base import Algorithm, LocalPlan, cross_entropy
from fedforge.algorithms.local import GradHook, declared_linear_term
from fedforge.core.device import module_device
from fedforge.core.params import ParamSpec
from fedforge.models.perceptron import perceptron_layers


def mlp_layers(model: nn.Module) -> list[str] | None:
    """The names of ``model``'s linear layers in order, ReLU between each pair,
    as the model declares them (None: it declares no such chain, or has a frozen
    parameter the fused step would move)."""
    if not all(p.requires_grad for p in model.parameters()):
        return None
    return perceptron_layers(model)


@dataclass(frozen=True)
class Terms:
    """The algorithm terms of the fused update: the proximal coefficient (FedProx's
    mu) and each client's constant shift of its gradient (SCAFFOLD's c - c_k)."""

    mu: float = 0.0
    correction: torch.Tensor | None = None  # [K, P]


def fused_terms(hook: GradHook | None, state: Mapping[str, torch.Tensor] | None) -> Terms | None:
    """The terms ``hook`` declares it adds, or None when the fused path cannot
    compute them (a hook that declares no linear term, or client state other
    than the tensors its term names)."""
    term = declared_linear_term(hook)
    if term is None or set(state or {}) != set(term.state):
        return None
    if not term.state or state is None:
        return Terms(mu=term.proximal)
    shift: torch.Tensor | None = None
    for name, coef in term.state.items():
        part = state[name] if coef == 1.0 else coef * state[name]
        shift = part if shift is None else shift + part
    return Terms(mu=term.proximal, correction=shift)


def fits(model: nn.Module, algorithm: Algorithm, plan: LocalPlan) -> bool:
    """The model, loss and plan the fused path computes (its algorithm terms
    aside), on the CPU."""
    return (
        module_device(model).type == "cpu"
        and mlp_layers(model) is not None
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
    lr: float | torch.Tensor,
    terms: Terms | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K clients' local SGD from ``start`` over the steps ``index [S, K, W]``
    (rows of ``x_all``/``y_all``; ``mask`` marks real rows), with ``terms``
    added to every gradient, at one ``lr`` or each client's (``[K]``). Returns
    the final parameters ``[K, P]`` and each client's summed training loss (float64)."""
    terms = terms or Terms()
    k, width = index.shape[1], index.shape[2]
    order, index, mask, live = _longest_first(index, mask)
    w0, b0 = _layer_views(spec, start.unsqueeze(0), layers)  # W_t, [1, ...]
    # The clients' weights, one contiguous [K, out, in] tensor a layer (updated in
    # place): an in-place batched product into views of the [K, P] parameters
    # (batch stride P) goes through a temporary, ~1.4x the update's time here.
    # (repeat, not expand().contiguous(): for K = 1 that would be start itself.)
    weights = [w.repeat(k, 1, 1) for w in w0]
    biases = [b.repeat(k, 1) for b in b0]  # [K, out]
    corr_w: list[torch.Tensor] = []
    corr_b: list[torch.Tensor] = []
    if terms.correction is not None:
        corr = terms.correction[order].to(start.dtype)
        corr_w, corr_b = _layer_views(spec, corr, layers)
    x_flat = x_all.reshape(x_all.shape[0], -1)
    # Each step's rows, client by client: the live clients' rows are a prefix.
    flat_index = index.reshape(index.shape[0], k * width)  # (no -1: a chunk may have no step)
    scale, labels, minus_one = _step_constants(index, mask, y_all, start.dtype)
    rates = lr[order].to(start.dtype) if isinstance(lr, torch.Tensor) else None
    if rates is not None:
        # Each client's lr folded into its logits' gradient: every product below
        # is linear in it, so each layer's step is then -1 x (lr_k G)^T H.
        scale = scale * rates.view(1, -1, 1, 1)
    picked = torch.zeros(index.shape, dtype=start.dtype)  # log p(label), [S, K, W]
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
        inputs, logits = _forward(h, wts, bcols)
        grad, picked[step, :a] = _logit_grad(
            logits, labels[step, :a], minus_one[:a], scale[step, :a]
        )
        step_lr = lr if rates is None else rates[:a]
        _backward_step(grad, inputs, ws, bs, (w0, b0, cws, cbs), step_lr, terms.mu)
    loss_sum = -(picked.to(torch.float64) * mask).sum(dim=(0, 2))  # real rows only
    params = start.expand(k, -1).clone()  # in the callers' order: row order[j] is w[j]
    w_out, b_out = _layer_views(spec, params, layers)
    for w_to, b_to, w, b in zip(w_out, b_out, weights, biases, strict=True):
        w_to.index_copy_(0, order, w)
        b_to.index_copy_(0, order, b)
    return params, loss_sum[torch.argsort(order)]


def _longest_first(
    index: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """The clients in the order of their steps, most first (``order``), ``index``
    and ``mask`` in that order, and per step how many clients still train.

    At step s only the first live[s] clients still train, so the products run on
    a prefix of the stacked weights (a view) instead of padding finished clients
    (quantity skew made whole chunks wait on their largest client). Every client
    starts from ``start``, so the order changes nothing but which rows are
    computed; the caller undoes it at the end."""
    order = torch.argsort(mask.any(dim=2).sum(dim=0), descending=True, stable=True)
    index, mask = index[:, order], mask[:, order]
    live: list[int] = mask.any(dim=2).sum(dim=1).tolist()  # [S]: clients still training
    return order, index, mask, live


def _layer_views(
    spec: ParamSpec, flat: torch.Tensor, layers: Sequence[str]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The weights and the biases of ``layers``, as views of ``flat [K, P]``."""
    views = spec.views(flat)
    return [views[f"{n}.weight"] for n in layers], [views[f"{n}.bias"] for n in layers]


def _step_constants(
    index: torch.Tensor, mask: torch.Tensor, y_all: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-step constants, made once for the chunk instead of once a step (at
    B = 10 a step's products are small and every extra op shows): the scale of
    d(mean loss)/dz (1/n_k on a client's real rows, 0 on padding) ``[S, K, W, 1]``,
    the labels ``[S, K, W, 1]`` and the softmax gradient's -1 ``[K, W, 1]``."""
    counts = mask.sum(dim=2, keepdim=True).clamp(min=1).to(dtype)  # [S, K, 1]
    scale = (mask.to(dtype) / counts).unsqueeze(3)
    labels = y_all[index].unsqueeze(3)
    minus_one = torch.full((index.shape[1], index.shape[2], 1), -1.0, dtype=dtype)
    return scale, labels, minus_one


def _forward(
    h: torch.Tensor, wts: Sequence[torch.Tensor], bcols: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each layer's input and the logits, for the live clients' batch ``h``."""
    inputs = []
    last = len(wts) - 1
    for i in range(last + 1):
        inputs.append(h)
        h = torch.baddbmm(bcols[i], h, wts[i])
        if i < last:
            h = h.relu_()
    return inputs, h


def _logit_grad(
    logits: torch.Tensor, y: torch.Tensor, minus_one: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean cross-entropy's gradient at the logits ``[a, W, C]`` (zero on
    padded rows) and each row's log p(label) ``[a, W]``; ``logits`` is overwritten."""
    logp = torch.log_softmax(logits, dim=2)
    log_picked = logp.gather(2, y).squeeze(2)
    grad = logp.exp_()  # softmax
    grad.scatter_add_(2, y, minus_one)
    grad.mul_(scale)
    return grad, log_picked


def _backward_step(
    grad: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    ws: Sequence[torch.Tensor],
    bs: Sequence[torch.Tensor],
    fixed: tuple[Sequence[torch.Tensor], ...],
    lr: float | torch.Tensor,
    mu: float,
) -> None:
    """Back from the logits' gradient ``grad`` through every layer, each layer's
    SGD step (with the terms: ``fixed`` holds W_t's weights and biases and the
    shift's, empty without one) fused into its weight-gradient product. ``lr``:
    one for every client, or each live client's ``[a]``, already folded into
    ``grad`` (the terms take it here)."""
    w0, b0, cws, cbs = fixed
    product_lr = 1.0 if isinstance(lr, torch.Tensor) else lr
    for i in range(len(ws) - 1, -1, -1):
        below = torch.bmm(grad, ws[i]) if i > 0 else None  # before W moves
        if mu or cws:
            shift = (cws[i], cbs[i]) if cws else None
            _terms_step(ws[i], bs[i], (w0[i], b0[i]), shift, lr, mu)
        ws[i].baddbmm_(grad.transpose(1, 2), inputs[i], alpha=-product_lr)
        bs[i].add_(grad.sum(dim=1), alpha=-product_lr)
        if below is not None:  # through the ReLU of layer i - 1, as autograd does
            grad = torch.ops.aten.threshold_backward(below, inputs[i], 0.0)


def _terms_step(
    w: torch.Tensor,
    b: torch.Tensor,
    start: tuple[torch.Tensor, torch.Tensor],
    shift: tuple[torch.Tensor, torch.Tensor] | None,
    lr: float | torch.Tensor,
    mu: float,
) -> None:
    """One layer's step of the terms: - lr p (W - W_t) and - lr s_k, at one lr or
    at each live client's (``lr [a]``)."""
    w0, b0 = start
    if isinstance(lr, torch.Tensor):
        lr_w, lr_b = lr.view(-1, 1, 1), lr.view(-1, 1)
        if mu:
            w.mul_(1.0 - lr_w * mu).add_(w0 * (lr_w * mu))
            b.mul_(1.0 - lr_b * mu).add_(b0 * (lr_b * mu))
        if shift is not None:
            w.sub_(shift[0] * lr_w)
            b.sub_(shift[1] * lr_b)
        return
    if mu:
        shrink = 1.0 - lr * mu
        w.mul_(shrink).add_(w0, alpha=lr * mu)
        b.mul_(shrink).add_(b0, alpha=lr * mu)
    if shift is not None:
        w.add_(shift[0], alpha=-lr)
        b.add_(shift[1], alpha=-lr)

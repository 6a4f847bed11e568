"""Per-FedAvg: Fallah, Mokhtari, Ozdaglar 2020, "Personalized Federated Learning
with Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach" (NeurIPS),
Algorithm 1 and its first-order (FO) and Hessian-free (HF) variants.

Runs on the clients (tau local meta-steps from the global weights); the server
is FedAvg's (the weighted mean of the deltas: the paper's average of the
returned models when clients are weighted equally; any server optimizer).
Trusts each client's ``num_examples``, like FedAvg. Keeps nothing per client.

The meta-objective is F(w) = (1/n) sum_i f_i(w - alpha grad f_i(w)): a model
that does well after one local gradient step of size alpha. One meta-step of
client i, with D, D', D'' three independent minibatches of its data (drawn in
this order, each ``batch_size`` examples without replacement; the whole client
data set when ``batch_size`` is null or not smaller):

    w'  = w - alpha grad f(w; D)                     (temporary, personalised)
    FO: w <- w - beta grad f(w'; D')
    HF: w <- w - beta (grad f(w'; D') - alpha H(w; D'') grad f(w'; D'))

FO drops the second-order term (and draws no D''). HF's Hessian-vector product
H(w; D'') v is computed exactly (``hvp="exact"``: double backward, the gradient
of <grad f(w; D''), v>) or, as in the paper, by the central difference
(``hvp="finite_difference"``): (grad f(w + delta v; D'') - grad f(w - delta v;
D'')) / (2 delta). beta is the plan's ``lr`` (so ``lr_decay`` decays it); a
period of k rounds (``upload_every``) does k tau meta-steps. The reported
training loss is the mean of f(w; D) over the meta-steps. Personalised
evaluation (one step of size alpha from the global model, then the client's
held-out slice) is in ``fedforge.evaluation.personal``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call

from fedforge.algorithms.base import Algorithm, LocalPlan, LossFn, cross_entropy
from fedforge.algorithms.local import LocalResult
from fedforge.algorithms.plan import DecayedPlan
from fedforge.core.params import ParamSpec
from fedforge.core.precision import forward_context

Variant = Literal["fo", "hf"]
HvpMethod = Literal["exact", "finite_difference"]


def sample_batch(num_examples: int, batch_size: int | None, gen: torch.Generator) -> torch.Tensor:
    """Indices of one minibatch: ``batch_size`` of the ``num_examples`` drawn without
    replacement from ``gen``; all of them, in order and without a draw, when
    ``batch_size`` is None or not smaller than ``num_examples``."""
    if batch_size is None or batch_size >= num_examples:
        return torch.arange(num_examples)
    return torch.randperm(num_examples, generator=gen)[:batch_size]


def _leaves(
    spec: ParamSpec, params: torch.Tensor
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Tensors for ``functional_call`` over views of ``params`` (detached): the
    trainable ones leaves that require grad (also returned in spec order), buffers
    without gradient. Nothing here writes into ``params``."""
    train = {e.name for e in spec.entries if e.trainable}
    leaves = {
        k: v.detach().requires_grad_(True) if k in train else v.detach()
        for k, v in spec.views(params).items()
    }
    return leaves, [leaves[e.name] for e in spec.entries if e.trainable]


def _flat(spec: ParamSpec, grads: tuple[torch.Tensor, ...], like: torch.Tensor) -> torch.Tensor:
    """Per-tensor gradients of the trainable entries as one flat vector like
    ``like`` (zeros in the slots of buffers, which gradients never move)."""
    it = iter(grads)
    return torch.cat(
        [
            next(it).reshape(-1) if e.trainable else torch.zeros_like(like[e.slice])
            for e in spec.entries
        ]
    )


@dataclass(frozen=True)
class Gradients:
    """Loss gradients of a model at flat parameter vectors (mean loss over a batch)."""

    model: nn.Module
    spec: ParamSpec
    loss_fn: LossFn
    precision: str = "fp32"

    def _loss(
        self, leaves: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        with forward_context(self.precision, x.device.type):
            logits = functional_call(self.model, leaves, (x,))
        return self.loss_fn(logits.to(dtype), y).mean()

    def grad(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """(flat gradient of the mean loss at ``params``, that loss)."""
        leaves, tensors = _leaves(self.spec, params)
        loss = self._loss(leaves, x, y, params.dtype)
        grads = torch.autograd.grad(loss, tensors)
        return _flat(self.spec, grads, params), float(loss.detach())

    def hvp(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        v: torch.Tensor,
        method: HvpMethod = "exact",
        delta: float = 1e-3,
    ) -> torch.Tensor:
        """H(params; x, y) v, flat: exactly by double backward, or by the central
        difference of two gradients ``delta`` apart along ``v``."""
        if method == "finite_difference":
            plus = self.grad(params + delta * v, x, y)[0]
            minus = self.grad(params - delta * v, x, y)[0]
            return (plus - minus) / (2.0 * delta)
        leaves, tensors = _leaves(self.spec, params)
        loss = self._loss(leaves, x, y, params.dtype)
        grads = torch.autograd.grad(loss, tensors, create_graph=True)
        views = self.spec.views(v.detach())
        along = [views[e.name] for e in self.spec.entries if e.trainable]
        dot = sum((g * u).sum() for g, u in zip(grads, along, strict=True))
        assert isinstance(dot, torch.Tensor)
        return _flat(self.spec, torch.autograd.grad(dot, tensors), params)


@dataclass(frozen=True)
class MetaSteps:
    """Per-FedAvg's local loop (an ``Algorithm.local_train``): ``steps`` meta-steps
    a round of the ``variant`` (see the module docstring), beta = ``plan.lr``."""

    variant: Variant
    alpha: float
    steps: int
    hvp: HvpMethod = "exact"
    delta: float = 1e-3

    def __call__(
        self,
        model: nn.Module,
        spec: ParamSpec,
        start: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        plan: LocalPlan,
        loss_fn: LossFn,
        gen: torch.Generator,
    ) -> LocalResult:
        grads = Gradients(model, spec, loss_fn, plan.precision)
        model.train()
        params = start.detach().clone()
        n, b = len(y), plan.batch_size
        total_loss, seen = 0.0, 0
        steps = self.steps * plan.local_epochs  # a period of k rounds: k tau meta-steps
        for _ in range(steps):
            d, d1 = sample_batch(n, b, gen), sample_batch(n, b, gen)
            g, loss = grads.grad(params, x[d], y[d])
            temp = params - self.alpha * g  # the personalised model w'
            direction = grads.grad(temp, x[d1], y[d1])[0]
            if self.variant == "hf":
                d2 = sample_batch(n, b, gen)
                hv = grads.hvp(params, x[d2], y[d2], direction, self.hvp, self.delta)
                direction = direction - self.alpha * hv
            params = params - plan.lr * direction
            total_loss += loss * len(d)
            seen += len(d)
        return LocalResult(params, total_loss / max(seen, 1), steps)


def perfedavg(
    batch_size: int | None,
    alpha: float,
    beta: float,
    steps: int,
    variant: Variant = "fo",
    hvp: HvpMethod = "exact",
    delta: float = 1e-3,
    lr_decay: float = 1.0,
) -> Algorithm:
    """Per-FedAvg with inner step ``alpha``, outer step ``beta`` (decayed per round
    by ``lr_decay``), tau = ``steps`` meta-steps a round on minibatches of
    ``batch_size`` (None: the whole client data set)."""
    if variant not in ("fo", "hf"):
        raise ValueError(f"Per-FedAvg variant {variant!r} must be 'fo' or 'hf'")
    if hvp not in ("exact", "finite_difference"):
        raise ValueError(f"Per-FedAvg hvp {hvp!r} must be 'exact' or 'finite_difference'")
    if alpha < 0 or beta <= 0 or steps < 1 or delta <= 0:
        raise ValueError(
            f"Per-FedAvg needs alpha >= 0, beta > 0, steps >= 1, delta > 0; got alpha = "
            f"{alpha}, beta = {beta}, steps = {steps}, delta = {delta}"
        )
    plan = DecayedPlan(LocalPlan(1, batch_size, beta), lr_decay)
    loop = MetaSteps(variant, alpha, steps, hvp, delta)
    return Algorithm("perfedavg", plan, cross_entropy, local_train=loop)

"""q-FedAvg (Li, Sanjabi, Beirami and Smith 2020, "Fair Resource Allocation in
Federated Learning", ICLR; Algorithm 2): FedAvg on the q-fair objective
sum_k p_k F_k^{q+1}(w) / (q + 1), which weighs the clients with a larger loss more
and so spreads accuracy more evenly over the clients. q = 0 is FedAvg with
uniform weights.

Client k, given w^t: F_k = F_k(w^t), its mean loss on its training data before
training; local SGD as FedAvg's to w_k; then, with L the Lipschitz estimate
(option ``L``; None: 1 / lr, the round's learning rate, as the paper sets it),

    Delta w_k = L (w^t - w_k),    Delta_k = F_k^q Delta w_k,
    h_k = q F_k^(q-1) ||Delta w_k||^2 + L F_k^q,

and the server steps to w^{t+1} = w^t - sum_k Delta_k / sum_k h_k.

On fedforge: the client uploads -Delta_k as its delta (through the run's codec)
and h_k beside it (an algorithm scalar, ``alg/h``, [1]); aggregated with uniform
weights the deltas give -mean Delta_k, which the server step scales by
K / sum h_k. The server cannot recompute h_k (it needs F_k, the client's loss):
it refuses an h_k that is not positive, and otherwise takes the client's word,
so a lying client can shrink or stretch the round's step. Run it among
clients you trust.

    fedforge run --plugin examples/qfedavg.py --config examples/qfedavg.yaml

Needs ``aggregation.weights: uniform`` and the plain mean (refused otherwise,
in one line). Delta_k grows as F_k^q: fedforge's default norm gates
(``robust.max_norm_multiple``, ``robust.max_update_ratio``) would refuse the
high-loss clients, the very ones q-FedAvg favours, so with q > 0 a config that
keeps them is refused (its yaml turns them off). The client's own loop (F_k
before local SGD) runs on the serial engine and worker processes; ``engine:
vectorized`` runs it serially and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

import torch
from torch.func import functional_call

import fedforge
from fedforge.algorithms import (
    StatelessClientTerms,
    StatelessServerTerms,
    drops_stragglers,
    local_plan,
    require_mean,
)
from fedforge.algorithms.local import ClientJob, LocalResult
from fedforge.algorithms.plan import DecayedPlan, cross_entropy
from fedforge.client.runtime import local_sgd
from fedforge.config.ranges import Range

H = "h"  # the update's scalar beside the delta: h_k, [1]


@dataclass(frozen=True)
class Options:
    # fairness: 0 is FedAvg (uniform weights); larger favours the worst clients
    q: Annotated[float, Range(">= 0")] = 1.0
    # Lipschitz estimate of the gradient; None: 1 / lr of the round
    L: Annotated[float | None, Range("> 0", null="1 / lr")] = None


def h_of(loss: float, q: float, big_l: float, dw2: float) -> float:
    """h_k = q F^(q-1) ||Delta w||^2 + L F^q. At F = 0 under q < 1 the first term
    has no value; the client's Delta_k = F^q Delta w is 0 there, and so is its
    share of the step: the term is left out."""
    steep = q > 0 and (loss > 0 or q >= 1)
    return big_l * loss**q + (q * loss ** (q - 1) * dw2 if steep else 0.0)


class QClient(StatelessClientTerms):
    """The client half: its own loop (F_k at w^t, then FedAvg's local SGD, then
    the upload -Delta_k and h_k) and the tensor h_k sent beside the update. The
    runtime trains a client and then ends it, one client at a time, so ``end``
    sends the h_k of the training just done."""

    def __init__(self, q: float, lipschitz: float | None) -> None:
        self.q, self.lipschitz = q, lipschitz
        self._h: torch.Tensor | None = None

    def __call__(self, model, spec, start, x, y, plan, loss_fn, gen) -> LocalResult:
        with torch.no_grad():
            loss = float(loss_fn(functional_call(model, spec.views(start), (x,)), y).mean())
        trained = local_sgd(model, spec, start, x, y, plan, loss_fn, gen)
        big_l = self.lipschitz if self.lipschitz is not None else 1.0 / plan.lr
        dw = big_l * (start - trained.params)  # Delta w_k
        self._h = torch.tensor([h_of(loss, self.q, big_l, float(dw @ dw))], dtype=start.dtype)
        return LocalResult(start - loss**self.q * dw, trained.train_loss, trained.steps)

    def end(self, job: ClientJob) -> dict[str, torch.Tensor]:
        h, self._h = self._h, None
        if h is None:
            raise RuntimeError("q-FedAvg: a client ended without its local training")
        return {H: h.to(job.start.device)}


class PositiveH(StatelessServerTerms):
    """The server half: no state; each update carries h_k, which must be > 0."""

    def __init__(self) -> None:
        super().__init__(H)

    def admit(
        self, delta: torch.Tensor, extras: Mapping[str, torch.Tensor], num_examples: int
    ) -> dict[str, torch.Tensor]:
        if not float(extras[H][0]) > 0:
            raise ValueError(f"h_k = {float(extras[H][0])} must be > 0")
        return dict(extras)


def server_step(
    aggregate: torch.Tensor,
    state: Mapping[str, torch.Tensor],
    received: Sequence[Mapping[str, torch.Tensor]],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-sum Delta_k / sum h_k from the uniform mean of the -Delta_k (no state)."""
    total_h = sum(float(e[H][0]) for e in received)
    return aggregate * (len(received) / total_h), dict(state)


def factory(context: fedforge.ComponentContext) -> fedforge.Algorithm:
    cfg, options = context.cfg, context.options
    require_mean(cfg, "qfedavg", "uniform", "sums Delta_k / sum h_k")
    gates = cfg.robust.max_norm_multiple, cfg.robust.max_update_ratio
    if options.q > 0 and gates != (None, None):
        raise fedforge.ConfigError(
            "algorithm 'qfedavg' with q > 0 scales the updates of high-loss clients by "
            "F_k^q, which the norm gates would refuse: set robust.max_norm_multiple: null "
            f"and robust.max_update_ratio: null (got {gates[0]}, {gates[1]})"
        )
    client = QClient(options.q, options.L)
    return fedforge.Algorithm(
        "qfedavg",
        DecayedPlan(local_plan(cfg), cfg.lr_decay),
        cross_entropy,
        client=client,
        server=PositiveH(),
        local_train=client,
        server_step=server_step,
        drop_stragglers=drops_stragglers(cfg, True),
    )


fedforge.register_algorithm("qfedavg", factory, options=Options)

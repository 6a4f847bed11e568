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
and h_k beside it (an algorithm tensor, ``alg/h``: h_k in its first entry, zeros
after it, since algorithm tensors are [P]); aggregated with uniform weights the deltas give
-mean Delta_k, which the server direction scales by K / sum h_k.

    fedforge run --plugin examples/qfedavg.py --config examples/qfedavg.yaml

Needs ``aggregation_weights: uniform`` and the plain mean (refused otherwise, in
one line). Delta_k grows as F_k^q: fedforge's default norm gates
(``robust.max_norm_multiple``, ``robust.max_update_ratio``) would refuse the
high-loss clients, the very ones q-FedAvg favours, so its config turns them
off. The client's own loop (F_k before local SGD) runs on the serial engine
and worker processes; ``engine: vectorized`` runs it serially and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.func import functional_call

import fedforge
from fedforge.algorithms import (
    StatelessClientTerms,
    StatelessServerTerms,
    drops_stragglers,
    local_plan,
)
from fedforge.algorithms.local import ClientJob, LocalResult
from fedforge.algorithms.plan import DecayedPlan, cross_entropy
from fedforge.client.runtime import local_sgd

H = "h"  # the update's tensor beside the delta: h_k in its first entry


@dataclass(frozen=True)
class Options:
    q: float = 1.0  # fairness: 0 is FedAvg (uniform weights); larger favours the worst clients
    L: float | None = None  # Lipschitz estimate of the gradient; None: 1 / lr of the round

    def check(self) -> None:
        if not self.q >= 0:
            raise ValueError(f"q = {self.q} must be >= 0")
        if self.L is not None and not self.L > 0:
            raise ValueError(f"L = {self.L} must be > 0 (or null: 1 / lr)")


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
        fq = loss**self.q
        h = big_l * fq + (self.q * loss ** (self.q - 1) * float(dw @ dw) if self.q else 0.0)
        self._h = torch.zeros_like(start)
        self._h[0] = h
        return LocalResult(start - fq * dw, trained.train_loss, trained.steps)

    def end(self, job: ClientJob) -> dict[str, torch.Tensor]:
        h, self._h = self._h, None
        if h is None:
            raise RuntimeError("q-FedAvg: a client ended without its local training")
        return {H: h.to(job.start.device)}


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
    if cfg.aggregation_weights != "uniform" or cfg.robust.aggregator != "mean":
        raise fedforge.ConfigError(
            "algorithm 'qfedavg' sums Delta_k / sum h_k: it needs aggregation_weights: uniform "
            f"and robust.aggregator: mean (got {cfg.aggregation_weights!r}, "
            f"{cfg.robust.aggregator!r})"
        )
    client = QClient(options.q, options.L)
    return fedforge.Algorithm(
        "qfedavg",
        DecayedPlan(local_plan(cfg), cfg.lr_decay),
        cross_entropy,
        client=client,
        server=StatelessServerTerms(H),  # each update carries h_k
        local_train=client,
        server_step=server_step,
        drop_stragglers=drops_stragglers(cfg, True),
    )


fedforge.register_algorithm("qfedavg", factory, options=Options)

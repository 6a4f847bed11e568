"""FedProx: Li et al. 2020, "Federated Optimization in Heterogeneous Networks"
(MLSys), Algorithm 2.

Runs on the clients: each minimises h_k(w; w_t) = F_k(w) + mu/2 ||w - w_t||^2,
anchored to the round's start weights w_t, by minibatch SGD; the proximal term
enters as a gradient hook, g + mu (w - w_t), so that both engines (serial and
vectorised) run it in the same step. The server is FedAvg's (the weighted mean
of the deltas, any server optimizer). Systems heterogeneity (the paper's
section 5.2): stragglers do fewer local epochs and FedProx aggregates their
partial work (``drop_stragglers=False``), where FedAvg drops them
(``server/stragglers.py``). Trusts each client's ``num_examples``, like FedAvg.
With mu = 0 it is FedAvg that keeps stragglers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedforge.algorithms.base import Algorithm, cross_entropy
from fedforge.algorithms.local import LinearTerm, StepContext
from fedforge.algorithms.plan import DecayedPlan, LocalPlan


@dataclass(frozen=True)
class ProximalTerm:
    """The gradient of mu/2 ||w - w_t||^2: adds mu (w - w_t) to every gradient
    (declared as a linear term, which fast paths fold into their update)."""

    mu: float

    def linear_term(self) -> LinearTerm:
        return LinearTerm(proximal=self.mu)

    def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        self.linear_term()(grads, ctx)


def fedprox(
    plan: LocalPlan, mu: float, lr_decay: float = 1.0, drop_stragglers: bool = False
) -> Algorithm:
    """FedProx with proximal coefficient ``mu`` (the paper's grid: 0.001, 0.01, 0.1, 1)
    on FedAvg's local ``plan``, its lr decayed by ``lr_decay`` a round."""
    if mu < 0:
        raise ValueError(f"FedProx mu = {mu} must be >= 0")
    return Algorithm(
        "fedprox",
        DecayedPlan(plan, lr_decay),
        cross_entropy,
        grad_hook=ProximalTerm(mu) if mu > 0 else None,  # mu = 0: FedAvg's own local step
        drop_stragglers=drop_stragglers,
    )

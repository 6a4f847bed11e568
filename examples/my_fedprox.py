"""FedProx (Li et al. 2020, "Federated Optimization in Heterogeneous
Networks"), written outside the package (docs/tutorial.md).

A round: each sampled client runs E epochs of minibatch SGD (B, lr) from the
global model w_t on its loss plus mu/2 ||w - w_t||^2; the server takes the
example-weighted mean of the deltas. Stragglers (clients that did fewer epochs) are kept.

    fedforge run --plugin examples/my_fedprox.py --config examples/my_fedprox.yaml
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch

import fedforge
from fedforge.algorithms import LinearTerm, StepContext, drops_stragglers, local_plan
from fedforge.algorithms.plan import DecayedPlan, cross_entropy
from fedforge.config.ranges import Range


@dataclass(frozen=True)
class Options:  # the config's plugin_options: {my_fedprox: {mu: 0.01}}
    # its range declared as every built-in field's; the paper's grid: 0.001 to 1
    mu: Annotated[float, Range(">= 0", note="FedProx's proximal coefficient")] = 0.01


@dataclass(frozen=True)
class Proximal:
    """Adds mu (w - w_t), the gradient of mu/2 ||w - w_t||^2, to each local gradient."""

    mu: float

    def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        for g, w, w_t in zip(grads, ctx.params, ctx.anchor, strict=True):
            g.add_(w - w_t, alpha=self.mu)

    def linear_term(self) -> LinearTerm:  # the same term, declared: fast engines fold it in
        return LinearTerm(proximal=self.mu)


def factory(context: fedforge.ComponentContext) -> fedforge.Algorithm:
    cfg = context.cfg
    return fedforge.Algorithm(
        "my_fedprox",
        DecayedPlan(local_plan(cfg), cfg.lr_decay),  # round t: E, B and lr * lr_decay**t
        cross_entropy,  # the run's task puts its own loss here
        grad_hook=Proximal(context.options.mu),
        drop_stragglers=drops_stragglers(cfg, False),  # stragglers.drop, else False
    )


fedforge.register_algorithm("my_fedprox", factory, options=Options)

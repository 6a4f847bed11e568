"""FedExP (Jhunjhunwala, Wang and Joshi 2023, "FedExP: Speeding Up Federated
Averaging via Extrapolation", ICLR; Algorithm 1): FedAvg whose server step size
adapts to the round, extrapolating past the clients' mean as POCS methods do.

With the M clients' updates Delta_i = w_i - w^t (FedAvg's local SGD) and their
mean Delta,

    eta_g = max(1, sum_i ||Delta_i||^2 / (2 M (||Delta||^2 + eps))),
    w^{t+1} = w^t + eta_g Delta.

On fedforge: the server half takes ||Delta_i||^2 of each update from the delta
it received (``admit``: nothing the client says, so no client can scale the
step by a number it sends), and the server step scales the uniform mean by
eta_g; a client sends its delta alone, as under FedAvg. It needs
``aggregation.weights: uniform`` and the plain mean (refused otherwise, in one
line); the server optimizer's ``lr`` (``server_optimizer.lr``) multiplies eta_g (1 in the paper).
The paper also reports the average of the last two iterates as the model; this
file leaves the iterates as they are.

    fedforge run --plugin examples/fedexp.py --config examples/fedexp.yaml
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

import torch

import fedforge
from fedforge.algorithms import (
    StatelessServerTerms,
    drops_stragglers,
    local_plan,
    require_mean,
)
from fedforge.algorithms.plan import DecayedPlan, cross_entropy
from fedforge.config.ranges import Range

SQ = "sq"  # what the server keeps of each update: ||Delta_i||^2, [1]


@dataclass(frozen=True)
class Options:
    # keeps eta_g finite when the clients' updates cancel out
    eps: Annotated[float, Range("> 0")] = 1e-3


class SquaredNorms(StatelessServerTerms):
    """The server half: no state; ||Delta_i||^2 of each update, from its delta."""

    def admit(
        self, delta: torch.Tensor, extras: Mapping[str, torch.Tensor], num_examples: int
    ) -> dict[str, torch.Tensor]:
        return {SQ: (delta @ delta).reshape(1)}


class Extrapolate:
    """eta_g times the uniform mean of the updates."""

    def __init__(self, eps: float) -> None:
        self.eps = eps

    def __call__(
        self,
        aggregate: torch.Tensor,
        state: Mapping[str, torch.Tensor],
        received: Sequence[Mapping[str, torch.Tensor]],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total = sum(float(e[SQ][0]) for e in received)
        eta = max(1.0, total / (2 * len(received) * (float(aggregate @ aggregate) + self.eps)))
        return eta * aggregate, dict(state)


def factory(context: fedforge.ComponentContext) -> fedforge.Algorithm:
    cfg = context.cfg
    require_mean(cfg, "fedexp", "uniform", "extrapolates the clients' mean")
    return fedforge.Algorithm(
        "fedexp",
        DecayedPlan(local_plan(cfg), cfg.lr_decay),
        cross_entropy,
        server=SquaredNorms(),
        server_step=Extrapolate(context.options.eps),
        drop_stragglers=drops_stragglers(cfg, True),
    )


fedforge.register_algorithm("fedexp", factory, options=Options)

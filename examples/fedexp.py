"""FedExP (Jhunjhunwala, Wang and Joshi 2023, "FedExP: Speeding Up Federated
Averaging via Extrapolation", ICLR; Algorithm 1): FedAvg whose server step size
adapts to the round, extrapolating past the clients' mean as POCS methods do.

With the M clients' updates Delta_i = w_i - w^t (FedAvg's local SGD) and their
mean Delta,

    eta_g = max(1, sum_i ||Delta_i||^2 / (2 M (||Delta||^2 + eps))),
    w^{t+1} = w^t + eta_g Delta.

On fedforge: each client sends ||Delta_i||^2 beside its delta (an algorithm
tensor, ``alg/sq``: the value in its first entry, zeros after it, since
algorithm tensors are [P]), and the server direction scales the uniform mean
by eta_g. It needs ``aggregation_weights: uniform`` and the plain mean (refused
otherwise, in one line); the server optimizer's ``server_lr`` multiplies eta_g
(1 in the paper). The paper also reports the average of the last two iterates
as the model; this file leaves the iterates as they are.

    fedforge run --plugin examples/fedexp.py --config examples/fedexp.yaml
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

import fedforge
from fedforge.algorithms import (
    StatelessClientTerms,
    StatelessServerTerms,
    drops_stragglers,
    local_plan,
)
from fedforge.algorithms.local import ClientJob
from fedforge.algorithms.plan import DecayedPlan, cross_entropy

SQ = "sq"  # the update's tensor beside the delta: ||Delta_i||^2 in its first entry


@dataclass(frozen=True)
class Options:
    eps: float = 1e-3  # keeps eta_g finite when the clients' updates cancel out

    def check(self) -> None:
        if not self.eps > 0:
            raise ValueError(f"eps = {self.eps} must be > 0")


class SquaredNorm(StatelessClientTerms):
    """The client half: sends ||Delta_i||^2; no per-client state."""

    def end(self, job: ClientJob) -> dict[str, torch.Tensor]:
        delta = job.result.params - job.start
        sq = torch.zeros_like(job.start)
        sq[0] = delta @ delta
        return {SQ: sq}


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
    if cfg.aggregation_weights != "uniform" or cfg.robust.aggregator != "mean":
        raise fedforge.ConfigError(
            "algorithm 'fedexp' extrapolates the clients' mean: it needs aggregation_weights: "
            f"uniform and robust.aggregator: mean (got {cfg.aggregation_weights!r}, "
            f"{cfg.robust.aggregator!r})"
        )
    return fedforge.Algorithm(
        "fedexp",
        DecayedPlan(local_plan(cfg), cfg.lr_decay),
        cross_entropy,
        client=SquaredNorm(),
        server=StatelessServerTerms(SQ),  # each update carries ||Delta_i||^2
        server_step=Extrapolate(context.options.eps),
        drop_stragglers=drops_stragglers(cfg, True),
    )


fedforge.register_algorithm("fedexp", factory, options=Options)

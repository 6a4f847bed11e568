"""FedNova: Wang et al. 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization" (NeurIPS), normalised averaging.

Clients that run different numbers of local steps tau_i (equal epochs over
unequal data, or stragglers' partial work) pull FedAvg's model towards the
clients that stepped most. FedNova divides each client's cumulative update
d_i = w_i - w by its normaliser a_i and rescales the weighted mean by
tau_eff = sum_i p_i a_i:

    w+ = w + tau_eff * sum_i p_i d_i / a_i,   p_i = n_i / sum_j n_j.

Under plain local SGD a_i = tau_i; with local momentum rho (``local.momentum``)
a_i = (tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho), the sum of the
momentum's step weights, as the authors' code does. A client sends d_i / a_i as
its delta and two scalars, n_i a_i and n_i; the server takes tau_eff from their
sums. It does not take a client's word for them: n_i is the example count the
update's header gives (the one its weight is capped by), and a_i must lie
between one step's and the plan's most steps' (E ceil(n_i / B)), else the
update is refused, so that no client can scale the round's step past what its
plan allows. p_i are the aggregator's weights, so the run must weigh by example counts
(``aggregation.weights: num_examples``, the default) with the plain mean.

    fedforge run --plugin examples/fednova.py --config examples/fednova.yaml
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

import fedforge
from fedforge.algorithms import (
    ClientJob,
    LocalPlan,
    StatelessClientTerms,
    drops_stragglers,
    local_plan,
    require_mean,
    summed,
)
from fedforge.algorithms.local import LocalResult
from fedforge.algorithms.plan import DecayedPlan, cross_entropy

N_A, N = "n_a", "n"  # per update: n_i a_i and n_i, scalars
TAU_EFF = "tau_eff"  # server state: the last round's tau_eff


def normaliser(steps: int, momentum: float) -> float:
    """a_i: the sum of the step weights of ``steps`` local steps (tau under plain SGD)."""
    tau = max(steps, 1)
    if momentum == 0.0:
        return float(tau)
    rho = momentum
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


class Normalise:
    """The client's delta times 1 / a_i."""

    def __init__(self, momentum: float) -> None:
        self.momentum = momentum

    def __call__(self, result: LocalResult) -> float:
        return 1.0 / normaliser(result.steps, self.momentum)


class NovaClient(StatelessClientTerms):
    """Sends n_i a_i and n_i beside the normalised delta; keeps no state."""

    def __init__(self, momentum: float) -> None:
        self.momentum = momentum

    def end(self, job: ClientJob) -> dict[str, torch.Tensor]:
        n = float(len(job.y))
        a = normaliser(job.result.steps, self.momentum)
        dtype = job.start.dtype
        return {N_A: torch.tensor([n * a], dtype=dtype), N: torch.tensor([n], dtype=dtype)}


class NovaServer:
    """tau_eff = sum n_i a_i / sum n_i over the used updates; the step scales the mean by it."""

    update_tensors: tuple[str, ...] = (N_A, N)

    def __init__(self, plan: LocalPlan) -> None:
        self.plan = plan

    def admit(
        self, delta: torch.Tensor, extras: Mapping[str, torch.Tensor], num_examples: int
    ) -> dict[str, torch.Tensor]:
        n_said = float(extras[N][0])
        a = float(extras[N_A][0]) / max(n_said, 1.0)
        n = max(num_examples, 1)
        most = normaliser(
            self.plan.local_epochs * -(-n // (self.plan.batch_size or n)), self.plan.momentum
        )
        if n_said != num_examples or not 1.0 - 1e-9 <= a <= most * (1 + 1e-9):
            raise ValueError(
                f"n_i = {n_said:g} (the header says {num_examples}) and a_i = {a:.6g} must be "
                f"the header's count and in [1, {most:.6g}] (one step to the plan's most)"
            )
        count = torch.tensor([float(num_examples)], dtype=extras[N].dtype)
        return {N_A: count * a, N: count}

    def initial_state(self, size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {TAU_EFF: torch.zeros(1, dtype=dtype)}

    def payload(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {}

    def moved(
        self,
        state: Mapping[str, torch.Tensor],
        extras: Sequence[Mapping[str, torch.Tensor]],
        num_clients: int,
    ) -> dict[str, torch.Tensor]:
        if not extras:
            return dict(state)
        n_a, n = summed(extras, N_A), summed(extras, N)
        return {TAU_EFF: (n_a / n).to(state[TAU_EFF].dtype)}

    def __call__(
        self,
        aggregate: torch.Tensor,
        state: Mapping[str, torch.Tensor],
        received: Sequence[Mapping[str, torch.Tensor]],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return aggregate * state[TAU_EFF].to(aggregate.dtype), dict(state)


def fednova(
    plan: LocalPlan, lr_decay: float = 1.0, drop_stragglers: bool = False
) -> fedforge.Algorithm:
    """FedNova on FedAvg's local ``plan`` (its momentum sets a_i)."""
    server = NovaServer(plan)
    return fedforge.Algorithm(
        "fednova",
        DecayedPlan(plan, lr_decay),
        cross_entropy,
        client=NovaClient(plan.momentum),
        server=server,
        update_scale=Normalise(plan.momentum),
        server_step=server,
        drop_stragglers=drop_stragglers,
    )


def factory(context: fedforge.ComponentContext) -> fedforge.Algorithm:
    cfg = context.cfg
    require_mean(cfg, "fednova", "num_examples", "weighs clients by their examples (p_i = n_i / n)")
    # stragglers' partial work is what FedNova normalises: kept unless told otherwise
    return fednova(local_plan(cfg), cfg.lr_decay, drops_stragglers(cfg, False))


fedforge.register_algorithm("fednova", factory)

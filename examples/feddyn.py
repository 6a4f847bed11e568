"""FedDyn: Acar et al. 2021, "Federated Learning Based on Dynamic
Regularization" (ICLR), Algorithm 1.

Client i keeps grad_i (zero at first). From the server model w in round t it
minimises

    L_i(w') - <grad_i, w'> + alpha/2 ||w' - w||^2

(a gradient term -grad_i + alpha (w' - w), declared linear so every engine
folds it into its step), reaching w_i, then sets grad_i <- grad_i - alpha (w_i - w).
The server keeps h (zero at first) and, over the used clients P_t of m = N,

    h <- h - alpha/m * sum_{i in P_t} (w_i - w),   w <- mean_{i in P_t} w_i - h / alpha.

The mean is uniform (``aggregation.weights: uniform``), as in the paper. The
server counts |P_t| itself (``admit`` gives each update it takes a 1): a
client sends its delta alone. The grad_i live in a per-client table
(checkpointed, a resumed run is bit-identical); like SCAFFOLD's controls, a
client's new grad_i is stored only once the server has used its update.

    fedforge run --plugin examples/feddyn.py --config examples/feddyn.yaml
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

import torch

import fedforge
from fedforge.algorithms import (
    ClientJob,
    LinearTerm,
    PendingClientTable,
    StepContext,
    drops_stragglers,
    local_plan,
    require_mean,
    summed,
)
from fedforge.algorithms.plan import DecayedPlan, LocalPlan, cross_entropy
from fedforge.config.ranges import Range
from fedforge.store import ClientStateStore, make_state_store, working_dir

GRAD = "grad"  # per-client table: grad_i
LINEAR = "feddyn_linear"  # per client during training: -grad_i
COUNT = "count"  # per update: 1 (summed: |P_t|)
H, USED = "h", "used"  # server state: h, and the last round's |P_t|


@dataclass(frozen=True)
class Options:
    alpha: Annotated[float, Range("> 0")] = 0.01


@dataclass(frozen=True)
class Regulariser:
    """Adds -grad_i + alpha (w' - w) to every local gradient."""

    alpha: float

    def linear_term(self) -> LinearTerm:
        return LinearTerm(proximal=self.alpha, state={LINEAR: 1.0})

    def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        self.linear_term()(grads, ctx)


class DynClient(PendingClientTable):
    """Reads grad_i from its table; holds grad_i - alpha (w_i - w) until the server
    used the client's update."""

    def __init__(self, store: ClientStateStore, alpha: float) -> None:
        super().__init__(GRAD, store)
        self.alpha = alpha

    def begin(
        self, client_ids: Sequence[int], start: torch.Tensor, extras: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        return {LINEAR: -self.rows(client_ids, start.dtype)}

    def end(self, job: ClientJob) -> dict[str, torch.Tensor]:
        grad = self.rows([job.client_id], job.start.dtype)[0]
        self.hold(job.client_id, grad - self.alpha * (job.result.params - job.start))
        return {}


class DynServer:
    """Keeps h; its step moves h by the used clients' sum and subtracts h / alpha."""

    update_tensors: tuple[str, ...] = ()

    def __init__(self, alpha: float, num_clients: int) -> None:
        self.alpha, self.m = alpha, num_clients

    def admit(
        self, delta: torch.Tensor, extras: Mapping[str, torch.Tensor], num_examples: int
    ) -> dict[str, torch.Tensor]:
        """The server counts the update itself: 1 (summed: |P_t|)."""
        return {COUNT: torch.ones(1, dtype=delta.dtype)}

    def initial_state(self, size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {H: torch.zeros(size, dtype=dtype), USED: torch.zeros(1, dtype=dtype)}

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
        return {H: state[H], USED: summed(extras, COUNT)}

    def __call__(
        self,
        aggregate: torch.Tensor,
        state: Mapping[str, torch.Tensor],
        received: Sequence[Mapping[str, torch.Tensor]],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # aggregate = mean (w_i - w): sum_{P_t} (w_i - w) = |P_t| aggregate
        h = state[H] - (self.alpha / self.m) * state[USED] * aggregate
        return aggregate - h / self.alpha, {H: h, USED: state[USED]}


def feddyn(
    plan: LocalPlan,
    store: ClientStateStore,
    alpha: float,
    num_clients: int,
    lr_decay: float = 1.0,
    drop_stragglers: bool = True,
) -> fedforge.Algorithm:
    """FedDyn on FedAvg's local ``plan``, with grad_i kept in ``store`` ([N, P])."""
    server = DynServer(alpha, num_clients)
    return fedforge.Algorithm(
        "feddyn",
        DecayedPlan(plan, lr_decay),
        cross_entropy,
        grad_hook=Regulariser(alpha),
        client=DynClient(store, alpha),
        server=server,
        server_step=server,
        drop_stragglers=drop_stragglers,
    )


def factory(context: fedforge.ComponentContext) -> fedforge.Algorithm:
    cfg, spec, dtype = context.cfg, context.spec, context.dtype
    require_mean(cfg, "feddyn", "uniform", "averages the clients' models uniformly")
    if spec is None or dtype is None:
        raise ValueError("FedDyn needs the model's size and dtype for its client table")
    store = make_state_store(
        cfg.num_clients, spec.size, dtype, working_dir("feddyn"), remove_dir=True
    )
    alpha = context.options.alpha
    return feddyn(
        local_plan(cfg), store, alpha, cfg.num_clients, cfg.lr_decay, drops_stragglers(cfg, True)
    )


fedforge.register_algorithm("feddyn", factory, options=Options)

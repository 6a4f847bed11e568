"""What an algorithm is (DESIGN idea 3): a small bundle, not a subclass tree.

A bundle holds what a client optimises and how (the local training plan of
each round) and which parameters are shared. Aggregators and server
optimizers compose with any bundle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedforge.algorithms.clusters import Clustering
from fedforge.algorithms.local import (
    ClientTerms,
    GradHook,
    LocalTrain,
    PersonalEntries,
    ServerStep,
    ServerTerms,
    UpdateScale,
)
from fedforge.algorithms.plan import LocalPlan, LossFn, cross_entropy
from fedforge.core.params import ParamKind

__all__ = ["Algorithm", "LocalPlan", "LossFn", "cross_entropy"]


@dataclass(frozen=True)
class Algorithm:
    """An FL algorithm: the client plan per round, the loss and what is shared.
    The server optimizer is not part of it: any composes with any algorithm
    (FedAdam is FedAvg with another server optimizer, see server/optimizers.py)."""

    name: str
    plan_fn: Callable[[int], LocalPlan]
    loss_fn: LossFn
    shared_kinds: tuple[ParamKind, ...] = ("weight", "batchnorm", "buffer")
    # a term added to every local gradient (FedProx's proximal term, SCAFFOLD's correction)
    grad_hook: GradHook | None = None
    client: ClientTerms | None = None  # per-client state and extra update tensors (SCAFFOLD)
    server: ServerTerms | None = None  # server state, payload extras and their update
    # the client's delta times a factor of its local result (FedNova's 1 / a_i)
    update_scale: UpdateScale | None = None
    # the aggregate the server optimizer applies and the server state after it,
    # from the aggregate and ``server.moved``'s state (FedNova, FedDyn)
    server_step: ServerStep | None = None
    personal: PersonalEntries | None = None  # entries each client keeps (FedBN's batch norm)
    drop_stragglers: bool = True  # FedAvg drops clients that did fewer epochs; FedProx keeps them
    # its own local loop instead of client.local_sgd (Per-FedAvg's meta-steps); the
    # serial engine and worker processes run it, the vectorised engine falls back
    local_train: LocalTrain | None = None
    # a model per cluster of clients (clustered FL, IFCA: algorithms/clustered.py):
    # the round trains each cluster's clients on its model (server/clustered.py)
    clusters: Clustering | None = None

    def plan(self, round_idx: int) -> LocalPlan:
        return self.plan_fn(round_idx)

"""A model per cluster of clients: the table the server keeps, the rule that
fills it, and the two geometric pieces every rule shares.

The table (:class:`ClusterTable`) is the server's state, checkpointed as three
fixed-shape tensors: ``cluster_models`` ``[M, P]`` (M: the most clusters held at
once), ``cluster_alive`` ``[M]`` (1 for a slot in use) and ``cluster_of``
``[N]`` (each client's cluster, -1 while it is not placed). A client is served
its cluster's model: it trains it and is evaluated with it. A client not
placed (never trained yet, or absent when its cluster split:
:meth:`ClusterTable.split`) is served the live model with the lowest loss on
its training data.

A :class:`Clustering` (the algorithm's ``clusters``) says where the first
models come from, which cluster each cohort client trains in a round, and
whether a cluster splits after it; the round (server/clustered.py) trains each
cluster's clients on its model, averages them into it, and merges clusters
whose models have come close (:meth:`ClusterTable.merge`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch

# (client id, models) -> the loss of each model on that client's training data
LossesFn = Callable[[int, Sequence[torch.Tensor]], list[float]]

MODELS, ALIVE, OF = "cluster_models", "cluster_alive", "cluster_of"


class Assignment(NamedTuple):
    """Where a round's cohort trains (a rule's ``assign``)."""

    cluster: dict[int, int]  # each cohort client's cluster this round
    # cohort clients not placed by training there: their lowest loss was shared by
    # several live models (a split's clusters still holding the same model)
    tied: frozenset[int] = frozenset()


class ClusterTable:
    """The clusters' models and each client's cluster (views of the state tensors)."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.models = state[MODELS]
        self.alive = state[ALIVE]
        self.cluster_of = state[OF]

    @staticmethod
    def initial_state(
        num_clients: int, max_clusters: int, size: int, dtype: torch.dtype
    ) -> dict[str, torch.Tensor]:
        return {
            MODELS: torch.zeros(max_clusters, size, dtype=dtype),
            ALIVE: torch.zeros(max_clusters, dtype=torch.int64),
            OF: torch.full((num_clients,), -1, dtype=torch.int64),
        }

    def state(self) -> dict[str, torch.Tensor]:
        return {MODELS: self.models, ALIVE: self.alive, OF: self.cluster_of}

    def live(self) -> list[int]:
        """The slots in use, ascending."""
        return [int(j) for j in self.alive.nonzero().flatten().tolist()]

    def open(self, model: torch.Tensor) -> int | None:
        """A new cluster holding ``model``: its slot, or None when every slot is used."""
        free = (self.alive == 0).nonzero().flatten().tolist()
        if not free:
            return None
        j = int(free[0])
        self.models[j] = model
        self.alive[j] = 1
        return j

    def members(self, cluster: int) -> list[int]:
        return [int(c) for c in (self.cluster_of == cluster).nonzero().flatten().tolist()]

    def served(self, client_id: int, losses_fn: LossesFn) -> int:
        """The cluster whose model ``client_id`` is served: its own, else the live
        one with the lowest loss on its data (ties: the lower slot)."""
        own = int(self.cluster_of[client_id])
        if own >= 0 and int(self.alive[own]):
            return own
        return self.closest(client_id, losses_fn)

    def closest(self, client_id: int, losses_fn: LossesFn) -> int:
        """The live cluster whose model has the lowest loss on ``client_id``'s data."""
        return self.pick(client_id, losses_fn)[0]

    def pick(self, client_id: int, losses_fn: LossesFn) -> tuple[int, bool]:
        """The live cluster whose model has the lowest loss on ``client_id``'s data
        (ties: the lower slot), and whether no other live cluster's is as low."""
        live = self.live()
        losses = [_finite(x) for x in losses_fn(client_id, [self.models[j] for j in live])]
        best = min(range(len(live)), key=lambda i: (losses[i], i))
        return live[best], losses.count(losses[best]) == 1

    def split(self, cluster: int, first: Sequence[int], second: Sequence[int]) -> int | None:
        """Split ``cluster`` by its clients whose updates were compared: ``first``
        stay, ``second`` go to a new cluster starting from its model (the new slot;
        None when every slot is used, and nothing moves). Its other members were
        absent from the comparison and are unplaced (-1): each is served the
        live model with the lowest loss on its data when it next trains."""
        k = self.open(self.models[cluster].clone())
        if k is None:
            return None
        self.cluster_of[self.cluster_of == cluster] = -1
        self.cluster_of[list(first)] = cluster
        self.cluster_of[list(second)] = k
        return k

    def largest(self) -> int:
        """The live cluster with the most clients placed (ties: the lower slot)."""
        live = self.live()
        return max(live, key=lambda j: (len(self.members(j)), -j))

    def merge(self, below: float) -> list[tuple[int, int]]:
        """Merge, closest pair first, live clusters whose models are within relative
        distance ``below`` (``||w_a - w_b|| / max(||w_a||, ||w_b||)``): the lower
        slot keeps the members' of both and their mean model, weighted by members
        (1 each for clusters with none placed). Returns the merged (kept, gone)."""
        done: list[tuple[int, int]] = []
        while below > 0:
            live = self.live()
            pairs = [
                (relative_distance(self.models[a], self.models[b]), a, b)
                for i, a in enumerate(live)
                for b in live[i + 1 :]
            ]
            close = [p for p in pairs if p[0] < below]
            if not close:
                break
            _, a, b = min(close)
            na, nb = max(len(self.members(a)), 1), max(len(self.members(b)), 1)
            self.models[a] = (na * self.models[a] + nb * self.models[b]) / (na + nb)
            self.cluster_of[self.cluster_of == b] = a
            self.alive[b] = 0
            done.append((a, b))
        return done


def _finite(x: float) -> float:
    return x if x == x and abs(x) != float("inf") else float("inf")


def relative_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / max(||a||, ||b||)`` (0 for two zero vectors)."""
    scale = max(float(a.norm()), float(b.norm()))
    return float((a - b).norm()) / scale if scale > 0 else 0.0


def cosine_matrix(updates: torch.Tensor) -> torch.Tensor:
    """``[K, K]`` cosine similarities of the rows of ``updates`` (a zero row: 0)."""
    u = updates.to(torch.float64)
    norms = u.norm(dim=1, keepdim=True)
    unit = torch.where(norms > 0, u / norms.clamp_min(1e-300), torch.zeros_like(u))
    return unit @ unit.T


def bipartition(similarity: torch.Tensor) -> tuple[list[int], list[int]]:
    """Two groups of the K >= 2 rows whose largest similarity across groups is small:
    agglomerative clustering with complete linkage on the distance 1 - similarity,
    stopped at two clusters (Sattler et al. 2020's optimal bipartition as their
    code computes it). Each group ascending; the one holding row 0 first."""
    k = similarity.shape[0]
    if k < 2:
        raise ValueError(f"a bipartition needs at least 2 rows, got {k}")
    dist = (1.0 - similarity.to(torch.float64)).tolist()
    groups = [[i] for i in range(k)]
    while len(groups) > 2:  # join the two groups whose farthest members are closest
        best = None
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                far = max(dist[a][b] for a in groups[i] for b in groups[j])
                if best is None or far < best[0]:
                    best = (far, i, j)
        assert best is not None
        _, i, j = best
        groups[i] = sorted(groups[i] + groups[j])
        del groups[j]
    first, second = sorted(groups, key=lambda g: g[0])
    return first, second


class Clustering(Protocol):
    """A clustered algorithm's rule (``Algorithm.clusters``). ``table`` is the
    table as the last round left it (the round sets it; evaluation reads it)."""

    name: str
    max_clusters: int
    merge_below: float
    table: ClusterTable | None

    def begin(self, table: ClusterTable, params: torch.Tensor, seed: int) -> None:
        """Open the first clusters' models in an empty table (the run's first round)."""
        ...

    def assign(
        self, table: ClusterTable, round_idx: int, cohort: Sequence[int], losses_fn: LossesFn
    ) -> Assignment:
        """The cluster each cohort client trains this round, and those of them
        whose choice was a tie (placed after the round, by the losses of the
        models it left: server/clustered.py)."""
        ...

    def split(
        self,
        round_idx: int,
        client_ids: Sequence[int],
        updates: torch.Tensor,
        weights: torch.Tensor,
    ) -> tuple[list[int], list[int]] | None:
        """After a cluster's step, from its clients' ``[K, P]`` updates: the two
        groups of client ids it splits into, or None to keep it whole."""
        ...

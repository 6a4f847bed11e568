"""SecAgg+ (Bell, Bonawitz, Gascón, Lepoint, Raykova 2020, "Secure single-server
aggregation with (poly)logarithmic overhead", CCS): who masks with whom and who
holds whose secret shares in a secure-aggregation round.

SecAgg (Bonawitz et al. 2017) uses the complete graph: every pair of the cohort
shares a mask and every client Shamir-shares its self-mask seed b_i and mask key
among all the others, O(n) work and bytes a client and O(n^2) on the server.
SecAgg+ replaces it by a random k-regular graph with k = O(log n): the Harary
graph H(k, n) (client at ring position p is adjacent to positions p +- 1, ...,
p +- k/2 mod n, so k is even) over a random permutation of the cohort. A client
masks pairwise and shares b_i and its mask key only within its neighbourhood;
a secret is rebuilt from t of the k + 1 shares of its closed neighbourhood
(the client holds one of its own, as the complete graph's code counts),
t = ceil(threshold (k + 1)).

The permutation comes from public randomness, (run seed, round) through
:mod:`fedforge.core.rng`, so the server and every client derive the same graph from
the round's cohort. Runs on both sides; trusts nothing but the seed and cohort.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from fedforge.core.rng import numpy_rng


def min_survivors(threshold: float, n: int) -> int:
    """t for ``n`` share holders: ceil(threshold n), and more than n / 2 (so two
    disjoint sets of holders cannot both rebuild a secret, whatever the rounding
    of a threshold just above 0.5)."""
    return max(n // 2 + 1, math.ceil(threshold * n - 1e-9))


@dataclass(frozen=True)
class MaskGraph:
    """The round's masking graph over the cohort and its share threshold t."""

    adjacency: Mapping[int, frozenset[int]]  # client -> its neighbours (not itself)
    t: int  # Shamir shares that rebuild a client's b or mask key

    def neighbours(self, client: int) -> frozenset[int]:
        return self.adjacency[client]

    def closed(self, client: int) -> frozenset[int]:
        """The client and its neighbours: the holders of its shares."""
        return self.adjacency[client] | {client}

    def within(self, client: int, ids: Iterable[int]) -> list[int]:
        """The sorted ``ids`` of ``client``'s closed neighbourhood."""
        near = self.closed(client)
        return sorted(i for i in ids if i in near)

    def shortfall(
        self, alive: Collection[int], whose: Iterable[int], phase: str, threshold: int
    ) -> str | None:
        """Why the round must end after ``phase``: fewer than ``threshold`` clients
        ``alive`` in all, else :meth:`short`; None when it can go on."""
        if len(alive) < threshold:
            return (
                f"secure aggregation: {len(alive)} client(s) left after '{phase}', "
                f"fewer than t = {threshold}"
            )
        return self.short(alive, whose, phase)

    def split(self, survivors: Collection[int]) -> str | None:
        """Why the round must end before unmasking: the survivors (U3) fall apart
        into groups with no mask between them, so the unmasking shares would give
        the server each group's sum, not only the total (SecAgg+ with dropouts;
        the complete graph never splits). None when they are connected."""
        left = set(survivors)
        if not left:
            return None
        seen, todo = set(), [min(left)]
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            todo.extend((self.adjacency[c] & left) - seen)
        if len(seen) == len(left):
            return None
        return (
            f"secure aggregation: the {len(left)} clients that sent masked inputs fall "
            f"apart into groups with no mask between them (one of {len(seen)}): unmasking "
            "would reveal each group's sum"
        )

    def short(self, alive: Collection[int], whose: Iterable[int], phase: str) -> str | None:
        """Why the round must end after ``phase``: a client of ``whose`` with fewer
        than t of its closed neighbourhood in ``alive`` (its secrets could not be
        rebuilt, or it could not share or mask); None when every one has t."""
        live = set(alive)
        for c in sorted(whose):
            near = self.closed(c)
            left = len(near & live)
            if left < self.t:
                return (
                    f"secure aggregation: client {c} has {left} of its {len(near)} "
                    f"neighbourhood (itself included) left after '{phase}', fewer than "
                    f"t = {self.t}"
                )
        return None


def complete_graph(clients: Sequence[int], t: int) -> MaskGraph:
    """SecAgg's graph: every client is every other's neighbour."""
    everyone = frozenset(clients)
    return MaskGraph({c: everyone - {c} for c in everyone}, t)


def harary(n: int, k: int) -> list[set[int]]:
    """The neighbours of each ring position of the Harary graph H(k, n), k even:
    p +- 1, ..., p +- k/2 mod n (every other position when k >= n - 1)."""
    if k % 2 or k < 2:
        raise ValueError(f"the Harary graph here needs an even k >= 2; got {k}")
    if k >= n - 1:
        return [set(range(n)) - {p} for p in range(n)]
    return [{(p + d) % n for d in range(-k // 2, k // 2 + 1) if d} for p in range(n)]


def random_harary(
    clients: Sequence[int], k: int, seed: int, round_idx: int, threshold: float
) -> MaskGraph:
    """SecAgg+'s graph for the round: H(k, n) over a permutation of the sorted
    cohort drawn from (seed, round); t = ceil(threshold (degree + 1))."""
    cohort = sorted(clients)
    order = numpy_rng(seed, "secagg_graph", round_idx).permutation(len(cohort)).tolist()
    at = [cohort[i] for i in order]  # the client at each ring position
    ring = harary(len(at), k)
    adjacency = {at[p]: frozenset(at[q] for q in ring[p]) for p in range(len(at))}
    return MaskGraph(adjacency, min_survivors(threshold, min(k, len(at) - 1) + 1))

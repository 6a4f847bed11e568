"""Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine
Learning with Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017).
Runs on the server over the gathered ``[K, P]`` updates; trusts no single
update and ignores the self-reported ``num_examples`` (one vote each).

With n updates of which up to f are Byzantine, the score of update i is the sum
of its squared distances to its n - f - 2 nearest other updates. Krum returns
the update of lowest score; Multi-Krum the mean of the m updates of lowest
scores (m = n - f by default). Both need n >= 2f + 3 and refuse fewer. Ties go
to the lower row (the cohort is in client-id order, so this is deterministic).
Distances come from one Gram product (O(K^2 P) flops, O(K^2) memory).
"""

from __future__ import annotations

import torch

from fedforge.aggregation.mean import Accumulator
from fedforge.core.errors import AggregationError, ConfigError
from fedforge.robust.common import RowStack, check_inputs, refuse_below, squared_distances


def krum_scores(dist: torch.Tensor, f: int) -> torch.Tensor:
    """``[n]`` Krum scores from ``[n, n]`` squared distances: the sum of each row's
    n - f - 2 smallest off-diagonal entries (at least one)."""
    n = dist.shape[0]
    neighbours = max(n - f - 2, 1) if n > 1 else 0
    if neighbours == 0:
        return torch.zeros(n, dtype=dist.dtype)
    off = dist + torch.diag(torch.full((n,), float("inf"), dtype=dist.dtype))
    return off.topk(neighbours, dim=1, largest=False).values.sum(dim=1)


def _check_f(name: str, f: int) -> int:
    if isinstance(f, bool) or not isinstance(f, int) or f < 0:
        raise ConfigError(
            f"{name}: f = {f!r} Byzantine clients is invalid: must be an integer >= 0"
        )
    return f


class Krum:
    """The single update closest to its n - f - 2 nearest neighbours."""

    name = "krum"
    needs_individual = True
    linear = False

    def __init__(self, f: int) -> None:
        self.f = _check_f(self.name, f)

    def min_updates(self) -> int:
        return 2 * self.f + 3

    def select(self, updates: torch.Tensor, m: int) -> torch.Tensor:
        """Rows of the m lowest scores, lowest first (stable: ties to the lower row)."""
        refuse_below(self.name, updates.shape[0], self.f, self.min_updates(), "2f + 3")
        scores = krum_scores(squared_distances(updates), self.f)
        order = torch.sort(scores, stable=True).indices
        return order[:m]

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_inputs(updates, weights)
        return updates[self.select(updates, 1)[0]].clone()

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return RowStack(self.aggregate)


class MultiKrum(Krum):
    """The mean of the m updates of lowest Krum score (m = n - f when None)."""

    name = "multi_krum"

    def __init__(self, f: int, m: int | None = None) -> None:
        super().__init__(f)
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ConfigError(f"multi_krum: m = {m!r} is invalid: must be an integer >= 1, or null")
        self.m = m

    def selected(self, n: int) -> int:
        m = n - self.f if self.m is None else self.m
        if m > n - self.f:  # refused at build for the full cohort; here fewer arrived
            raise AggregationError(
                f"multi_krum: m = {m} exceeds n - f = {n} - {self.f} = {n - self.f} updates"
            )
        return m

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_inputs(updates, weights)
        refuse_below(self.name, updates.shape[0], self.f, self.min_updates(), "2f + 3")
        rows = self.select(updates, self.selected(updates.shape[0]))
        return updates[rows.sort().values].mean(dim=0)

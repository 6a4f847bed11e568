"""Aggregators: how the server combines a cohort's deltas.

The weighted mean is FedAvg's rule (McMahan et al. 2017, Algorithm 1): weights
n_k / sum of the cohort's n_k. It is linear, so it streams: a running weighted
sum keeps server memory O(model), not O(cohort). Runs on the server; trusts the
weights it is given (validation happens before).
"""

from __future__ import annotations

from typing import Protocol

import torch


class Accumulator(Protocol):
    """A running aggregate of one round's updates."""

    def add(self, update: torch.Tensor, weight: float) -> None: ...

    def result(self) -> torch.Tensor: ...

    @property
    def count(self) -> int: ...


class Aggregator(Protocol):
    """Combines ``[K, P]`` updates with ``[K]`` weights into one ``[P]`` aggregate.

    ``needs_individual`` is True for rules (median, Krum...) that must see each
    update: they refuse secure aggregation. ``linear`` rules commute with sums."""

    name: str
    needs_individual: bool
    linear: bool

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor: ...

    def start(self, size: int, dtype: torch.dtype) -> Accumulator: ...


class RunningWeightedSum:
    def __init__(self, size: int, dtype: torch.dtype) -> None:
        self._sum = torch.zeros(size, dtype=dtype)
        self._weight = 0.0
        self._count = 0

    def add(self, update: torch.Tensor, weight: float) -> None:
        if weight < 0:
            raise ValueError(f"aggregation weight {weight} must be >= 0")
        self._sum.add_(update.to(self._sum.dtype), alpha=weight)
        self._weight += weight
        self._count += 1

    def add_sum(self, weighted_sum: torch.Tensor, weight: float, count: int) -> None:
        """Add ``count`` updates summed elsewhere: their weighted sum and total weight."""
        if weight < 0:
            raise ValueError(f"aggregation weight {weight} must be >= 0")
        self._sum.add_(weighted_sum.to(self._sum.dtype))
        self._weight += weight
        self._count += count

    def result(self) -> torch.Tensor:
        if self._count == 0 or self._weight <= 0:
            raise ValueError("no update with positive weight was aggregated")
        return self._sum / self._weight

    @property
    def count(self) -> int:
        return self._count


class WeightedMean:
    """sum_k w_k u_k / sum_k w_k (FedAvg with w_k = n_k)."""

    name = "weighted_mean"
    needs_individual = False
    linear = True

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if updates.ndim != 2 or weights.shape != updates.shape[:1]:
            raise ValueError(
                f"need updates [K, P] and weights [K]; got {tuple(updates.shape)}, "
                f"{tuple(weights.shape)}"
            )
        w = weights.to(updates.dtype)
        return (w @ updates) / w.sum()

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return RunningWeightedSum(size, dtype)

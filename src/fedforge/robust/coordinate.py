"""Coordinate-wise median and trimmed mean (Yin, Chen, Ramchandran, Bartlett,
"Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates",
ICML 2018). Runs on the server over the gathered ``[K, P]`` updates; trusts no
single update, and ignores the self-reported ``num_examples`` (one vote each).

Median: per coordinate, the middle value (mean of the two middle ones for even
K); with f < K/2 arbitrary rows it stays within the honest rows' range.
Trimmed mean (beta): per coordinate, drop the b = floor(beta K) largest and
b smallest values and average the K - 2b left; b is capped at (K - 1) // 2 so
that at least one value is left (a beta a hair under 1/2 would otherwise round
b up to K / 2 for an even K and average nothing).
"""

from __future__ import annotations

import math

import torch

from fedforge.aggregation.mean import Accumulator
from fedforge.core.errors import ConfigError
from fedforge.robust.common import (
    RowStack,
    by_columns,
    check_inputs,
    sort_columns,
    sorted_median,
)


class Median:
    """The coordinate-wise median."""

    name = "median"
    needs_individual = True
    linear = False

    def min_updates(self) -> int:
        return 1

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_inputs(updates, weights)
        return by_columns(updates, lambda block: sorted_median(sort_columns(block)))

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return RowStack(self.aggregate)


class TrimmedMean:
    """The coordinate-wise beta-trimmed mean, 0 <= beta < 1/2."""

    name = "trimmed_mean"
    needs_individual = True
    linear = False

    def __init__(self, beta: float) -> None:
        if not 0.0 <= beta < 0.5:
            raise ConfigError(f"trimmed mean beta = {beta!r} is invalid: must be in [0, 0.5)")
        self.beta = beta

    def trimmed(self, k: int) -> int:
        """Values dropped at each end of a column of ``k``: floor(beta k), the
        tolerance guarding against float error (0.3 x 10 is 2.999...), capped so
        that at least one value is left."""
        return min(math.floor(self.beta * k + 1e-9), (k - 1) // 2)

    def min_updates(self) -> int:
        return 1

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_inputs(updates, weights)
        k = updates.shape[0]
        b = self.trimmed(k)
        if b == 0:
            return updates.mean(dim=0)
        return by_columns(updates, lambda block: sort_columns(block)[b : k - b].mean(dim=0))

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return RowStack(self.aggregate)

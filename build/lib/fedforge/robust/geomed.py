"""The geometric median by smoothed Weiszfeld iterations: robust federated
aggregation, RFA (Pillutla, Kakade, Harchaoui, "Robust Aggregation for
Federated Learning", IEEE TSP 2022). Runs on the server over the gathered
``[K, P]`` updates; trusts no single update and ignores the self-reported
``num_examples`` (one vote each; RFA's paper weighs by them, which lets a
Byzantine client that lies about its size pull harder).

The geometric median minimises sum_k ||z - u_k||. Weiszfeld's fixed point
z <- sum_k b_k u_k / sum_k b_k, b_k = 1 / max(nu, ||z - u_k||), starts at the
coordinate-wise median (the mean, RFA's start, is dragged anywhere by one huge
update: 1e36 in float32 makes it inf, 1e10 left the iteration stopping at a
norm of 188 against 0.4); ``nu`` (smoothing) keeps a step finite when z lands on
an update, and an update too far to measure (its distance overflows) weighs 0.
It stops when the objective improves by less than ``tol`` (relative; while the
objective is not finite, when z moves by less than ``tol`` relative) or after
``max_iter`` steps. Its breakdown point is 1/2.
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


def _norm(v: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(v))


def distances_to(updates: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``[K]`` Euclidean distances from each row to ``z``, computed by differences
    (exact, no Gram cancellation), without a ``[K, P]`` temporary."""
    return torch.cdist(
        updates.unsqueeze(0), z[None, None, :], compute_mode="donot_use_mm_for_euclid_dist"
    )[0, :, 0]


class GeometricMedian:
    """Smoothed Weiszfeld; ``iterations`` of the last call are kept for inspection."""

    name = "geometric_median"
    needs_individual = True
    linear = False

    def __init__(self, max_iter: int = 100, tol: float = 1e-6, nu: float = 1e-6) -> None:
        if max_iter < 1 or tol <= 0 or nu <= 0:
            raise ConfigError(
                f"geometric median max_iter = {max_iter}, tol = {tol}, nu = {nu} are invalid: "
                "need max_iter >= 1, tol > 0, nu > 0"
            )
        self.max_iter, self.tol, self.nu = max_iter, tol, nu
        self.iterations = 0

    def min_updates(self) -> int:
        return 1

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_inputs(updates, weights)
        z = by_columns(updates, lambda block: sorted_median(sort_columns(block)))
        dist = distances_to(updates, z)
        objective = float(dist.sum())
        self.iterations = 0
        for _ in range(self.max_iter):
            b = 1.0 / dist.clamp(min=self.nu)  # inf distance: weight 0
            previous, z = z, (b / b.sum()) @ updates
            dist = distances_to(updates, z)
            self.iterations += 1
            new = float(dist.sum())
            if math.isfinite(new) and math.isfinite(objective):
                if objective - new <= self.tol * max(new, self.nu):
                    break
            elif _norm(z - previous) <= self.tol * max(_norm(z), self.nu):
                break
            objective = new
        return z

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return RowStack(self.aggregate)

"""A norm-filtered mean: the weighted mean of the updates whose L2 norm is at
most ``multiple`` times the cohort's median norm; the others are left out of
the round, and a warning line says which and why.

A cheap defence against a few scaled or diverged updates (in the spirit of
norm-based filters such as Sun et al. 2019, "Can You Really Backdoor Federated
Learning?"), written outside the package through the public API:

    fedforge run --plugin examples/norm_filtered_mean.py --config examples/norm_filtered_mean.yaml

The median is the lower middle norm for an even cohort (as fedforge's own norm
bounds take it). The rule must see each update, so it is refused under secure
aggregation (``needs_individual``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

import fedforge

log = logging.getLogger("fedforge.examples.norm_filtered_mean")


@dataclass(frozen=True)
class Options:
    multiple: float = 3.0  # keep updates with norm <= multiple x the cohort's median norm

    def check(self) -> None:
        if not self.multiple >= 1.0:
            raise ValueError(f"multiple = {self.multiple} must be >= 1 (the median update stays)")


class _Rows:
    """Gathers a round's rows, then aggregates them all at once."""

    def __init__(self, rule: NormFilteredMean) -> None:
        self.rule, self.rows, self.weights = rule, [], []

    def add(self, update: torch.Tensor, weight: float) -> None:
        self.rows.append(update)
        self.weights.append(weight)

    def result(self) -> torch.Tensor:
        return self.rule.aggregate(torch.stack(self.rows), torch.tensor(self.weights))

    @property
    def count(self) -> int:
        return len(self.rows)


class NormFilteredMean:
    name = "norm_filtered_mean"
    needs_individual = True  # it reads each update's norm
    linear = False

    def __init__(self, multiple: float) -> None:
        self.multiple = multiple
        self.left_out: list[int] = []  # the last round's rows left out, by position

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        norms = torch.linalg.vector_norm(updates, dim=1)
        bound = self.multiple * float(norms.median())  # lower middle for an even count
        keep = norms <= bound
        self.left_out = [int(i) for i in torch.nonzero(~keep).reshape(-1)]
        if self.left_out:
            shown = ", ".join(f"row {i} (norm {float(norms[i]):.4g})" for i in self.left_out)
            log.warning(
                "norm_filtered_mean: left out %d of %d updates above %g x median norm = %.4g: %s",
                len(self.left_out), len(norms), self.multiple, bound, shown,
            )  # fmt: skip
        w = weights.to(updates.dtype) * keep.to(updates.dtype)
        return (w @ updates) / w.sum()

    def start(self, size: int, dtype: torch.dtype) -> _Rows:
        return _Rows(self)


def factory(context: fedforge.ComponentContext) -> NormFilteredMean:
    return NormFilteredMean(context.options.multiple)


fedforge.register_aggregator("norm_filtered_mean", factory, options=Options)

"""Aggregation weights of the weighted mean (seed 003): what a client's update
counts for, from the ``num_examples`` it reports.

- ``num_examples`` (default): w_k = n_k, FedAvg (McMahan et al. 2017);
- ``uniform``: w_k = 1, every client alike whatever its size;
- ``sqrt``: w_k = sqrt(n_k), between the two;
- ``capped``: w_k = min(n_k, cap), so that no client outweighs ``cap`` examples.

:class:`Reweighted` wraps the weighted mean (gathered or streaming alike) and
maps each weight before it is used; the mean is then sum w_k u_k / sum w_k.
Runs on the server; trusts the reported ``num_examples`` as FedAvg does (capping
bounds what a liar gains). DP (its own fixed-denominator weights), secure
aggregation (clients weight before masking) and the robust rules (they ignore
``num_examples``) refuse any rule but the default (``experiment.build``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from fedforge.aggregators.mean import Accumulator, Aggregator

WeightRule = Literal["num_examples", "uniform", "sqrt", "capped"]


def client_weight(rule: WeightRule, num_examples: float, cap: float | None = None) -> float:
    """The weight of a client that reports ``num_examples`` under ``rule``."""
    if rule == "num_examples":
        return float(num_examples)
    if rule == "uniform":
        return 1.0
    if rule == "sqrt":
        return math.sqrt(num_examples)
    if cap is None:
        raise ValueError("capped aggregation weights need a cap")
    return float(min(num_examples, cap))


class _ReweightedAccumulator:
    def __init__(self, inner: Accumulator, rule: WeightRule, cap: float | None) -> None:
        self.inner, self.rule, self.cap = inner, rule, cap

    def add(self, update: torch.Tensor, weight: float) -> None:
        self.inner.add(update, client_weight(self.rule, weight, self.cap))

    def result(self) -> torch.Tensor:
        return self.inner.result()

    @property
    def count(self) -> int:
        return self.inner.count


class Reweighted:
    """``inner`` (a weighted mean) with each client's ``num_examples`` mapped by ``rule``."""

    def __init__(self, inner: Aggregator, rule: WeightRule, cap: float | None = None) -> None:
        self.inner, self.rule, self.cap = inner, rule, cap
        self.name = f"{inner.name}[{rule}]"
        self.needs_individual = inner.needs_individual
        self.linear = inner.linear

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        mapped = [client_weight(self.rule, float(w), self.cap) for w in weights.tolist()]
        return self.inner.aggregate(updates, torch.tensor(mapped, dtype=weights.dtype))

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return _ReweightedAccumulator(self.inner.start(size, dtype), self.rule, self.cap)

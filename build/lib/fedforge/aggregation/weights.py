"""Aggregation weights of the weighted mean: what a client's update counts for,
from the ``num_examples`` it reports.

- ``num_examples`` (default): w_k = n_k, FedAvg (McMahan et al. 2017);
- ``uniform``: w_k = 1, every client alike whatever its size;
- ``sqrt``: w_k = sqrt(n_k), between the two;
- ``capped``: w_k = min(n_k, cap), so that no client outweighs ``cap`` examples;
- ``quality``: w_k = n_k q_k with q_k = exp(-L_k / T) / sum_j exp(-L_j / T), the
  softmax over the cohort of minus each client's validation loss L_k (the loss of
  the global model it received on its own held-out split) at temperature T. A
  client whose data the consensus model fits badly -- noisy labels, another
  domain, rare classes alike -- counts less; at T -> infinity it is FedAvg. The
  loss is the client half of FOCUS's mutual cross-entropy (Chen et al. 2020,
  "FOCUS: Dealing with label quality disparity in federated learning"); its
  server half (the local model on a server benchmark set) is left out, since the
  server holds no data. exp(-L/T) rather than 1/(L + eps): the ratio of two
  weights depends only on the loss gap, not on how small the best loss is.
- ``class``: w_k = sum_c n_kc / N_c, N_c = sum_k n_kc the cohort's examples of
  class c (classes the cohort lacks drop out): inverse class frequency, the
  classical remedy for class imbalance, at the level of clients.
  sum_k w_k is the number of classes the cohort holds, and the mean
  sum_k w_k u_k / sum_k w_k is the average over classes of each class's
  example-weighted mean update: every class counts alike, however rare, so a
  client holding rare classes counts more.

The last two need what each client reports beside its update (its validation
loss, its label counts) and the whole cohort's reports: they are a cohort stage
(``fedforge.client.reports``), built from :func:`quality_weights` and
:func:`class_weights` below. The first four map each weight alone:
:class:`Reweighted` wraps the weighted mean (gathered or streaming alike) and
maps each weight before it is used; the mean is then sum w_k u_k / sum w_k.
Runs on the server; trusts the reported ``num_examples`` as FedAvg does (capping
bounds what a liar gains). DP (its own fixed-denominator weights), secure
aggregation (clients weight before masking) and the robust rules (they ignore
``num_examples``) refuse any rule but the default (``experiment.build``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch

from fedforge.aggregation.mean import Accumulator, Aggregator

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


def quality_factors(losses: Sequence[float], temperature: float) -> list[float]:
    """q_k = exp(-L_k / T) / sum_j exp(-L_j / T), computed shifted by the cohort's
    smallest loss so that no factor underflows to zero for all clients at once."""
    if temperature <= 0 or not math.isfinite(temperature):
        raise ValueError(f"quality temperature {temperature!r} must be a finite number > 0")
    if not losses:
        return []
    if not all(math.isfinite(v) for v in losses):
        raise ValueError(f"quality weights need finite losses, got {list(losses)!r:.200}")
    best = min(losses)
    raw = [math.exp(-(v - best) / temperature) for v in losses]
    total = sum(raw)
    return [r / total for r in raw]


def quality_weights(
    num_examples: Sequence[float], losses: Sequence[float], temperature: float
) -> list[float]:
    """w_k = n_k q_k (see :func:`quality_factors`)."""
    if len(num_examples) != len(losses):
        raise ValueError(f"{len(num_examples)} example counts for {len(losses)} losses")
    factors = quality_factors(losses, temperature)
    return [float(n) * q for n, q in zip(num_examples, factors, strict=True)]


def class_weights(label_counts: Sequence[Sequence[float]]) -> list[float]:
    """w_k = sum_c n_kc / N_c over the classes the cohort holds (N_c > 0)."""
    if not label_counts:
        return []
    widths = {len(row) for row in label_counts}
    if len(widths) != 1:
        raise ValueError(f"label counts of unequal lengths {sorted(widths)}")
    totals = [sum(col) for col in zip(*label_counts, strict=True)]
    return [
        sum(n / total for n, total in zip(row, totals, strict=True) if total > 0)
        for row in label_counts
    ]

"""Stragglers (Li et al. 2020, FedProx, section 5.2 "systems heterogeneity"): in
each round a fraction of the cohort cannot finish E local epochs and does a
random number of epochs in 1..E-1 (the official code's
``np.random.randint(low=1, high=E)``). FedAvg drops them (their work never
reaches the server); FedProx aggregates their partial work. Which clients
straggle and how far they get derive from (seed, round): a rerun and every
engine see the same stragglers. Runs on the server, when the round's tasks are made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fedforge.algorithms.base import Algorithm, LocalPlan
from fedforge.client.runtime import ClientTask
from fedforge.config import Config
from fedforge.core.rng import numpy_rng


def straggler_epochs(
    cohort: Sequence[int], fraction: float, local_epochs: int, seed: int, round_idx: int
) -> dict[int, int]:
    """The round's stragglers and the epochs each does, uniform in
    1..local_epochs - 1. The official code keeps round(|cohort| (1 - fraction))
    clients active (Python's round, half to even), so the stragglers are the rest:
    at 3 clients and 0.5, 1 straggler (round(1.5) = 2 active), not round(1.5) = 2."""
    count = len(cohort) - round(len(cohort) * (1 - fraction))
    if count == 0 or local_epochs < 2:
        return {}
    rng = numpy_rng(seed, "stragglers", round_idx)
    chosen = sorted(int(c) for c in rng.choice(list(cohort), size=count, replace=False))
    return {c: int(rng.integers(1, local_epochs)) for c in chosen}


def cohort_tasks(
    cfg: Config, algorithm: Algorithm, cohort: Sequence[int], round_idx: int, plan: LocalPlan
) -> list[ClientTask]:
    """The round's client tasks: stragglers get fewer epochs, or no task at all
    when the algorithm drops them."""
    slow = straggler_epochs(cohort, cfg.stragglers.fraction, plan.local_epochs, cfg.seed, round_idx)
    tasks = []
    for c in cohort:
        if c not in slow:
            tasks.append(ClientTask(c, round_idx, plan, cfg.seed))
        elif not algorithm.drop_stragglers:
            short = dataclasses.replace(plan, local_epochs=slow[c])
            tasks.append(ClientTask(c, round_idx, short, cfg.seed))
    return tasks

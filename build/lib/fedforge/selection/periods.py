"""Reduced upload frequency (the periodic averaging of local SGD,
Stich 2019, "Local SGD converges fast and communicates little"): with
``upload_every`` = k, rounds form periods of k (the last one may be shorter).

The cohort of a period is sampled once, from (seed, the period's first round);
it downloads the payload once, trains k rounds locally (k times the round's
local epochs, at the learning rate of the period's first round) and uploads
once, at the period's last round. The rounds before it record the local work
but carry no bytes and no evaluation: the global model does not change. The
whole period's computation runs in its last round, so a checkpoint between two
rounds of a period needs no client state and resume stays exact. With k = 1
every round is a period of one: plain FedAvg.
"""

from __future__ import annotations

import dataclasses

from fedforge.algorithms.base import Algorithm, LocalPlan


def upload_period(round_idx: int, upload_every: int, rounds: int) -> tuple[int, int]:
    """The first and last round of the period holding ``round_idx``."""
    start = round_idx - round_idx % upload_every
    return start, min(start + upload_every, rounds) - 1


def period_plan(algorithm: Algorithm, start: int, end: int) -> LocalPlan:
    """What each client of a period's cohort does between download and upload."""
    base = algorithm.plan(start)
    if end == start:
        return base
    return dataclasses.replace(base, local_epochs=base.local_epochs * (end - start + 1))

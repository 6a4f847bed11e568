"""Cohort sampling: each round the server picks max(1, C * N) of N clients
uniformly without replacement (McMahan et al. 2017, Algorithm 1), from a
generator derived from (seed, round): reruns pick the same cohorts. The
built-in selection policy ``uniform`` is this draw (named.py says the contract)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedforge.config.compat import cohort_size
from fedforge.core.rng import numpy_rng

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext
    from fedforge.selection.named import SelectionRound

COHORT = "cohort"  # the purpose key of a round's cohort generator (core/rng.py)


def cohort_rng(seed: int, round_idx: int) -> np.random.Generator:
    """The generator a round's cohort is drawn from."""
    return numpy_rng(seed, COHORT, round_idx)


def uniform_draw(pool: Sequence[int], m: int, rng: np.random.Generator) -> list[int]:
    """``m`` of ``pool`` uniformly without replacement, sorted."""
    return sorted(pool[int(i)] for i in rng.choice(len(pool), size=m, replace=False))


def sample_cohort(
    num_clients: int,
    client_fraction: float,
    seed: int,
    round_idx: int,
    poisson: bool = False,
    among: Sequence[int] | None = None,
) -> list[int]:
    """The sorted client ids of round ``round_idx``: m = max(1, C N) of them, or
    with ``poisson`` each client independently with probability C (DP-FedAvg's
    sampling, McMahan et al. 2018; the cohort may be empty). ``among``: drawn
    from these sorted ids only (a deployment's live clients; at most all of
    them), by the same draws, so that every id among them is every client's draw."""
    pool = list(range(num_clients)) if among is None else list(among)
    m = min(cohort_size(num_clients, client_fraction), len(pool))
    if poisson:
        draws = numpy_rng(seed, "cohort_poisson", round_idx).random(len(pool))
        return [pool[int(i)] for i in (draws < client_fraction).nonzero()[0]]
    return uniform_draw(pool, m, cohort_rng(seed, round_idx))


class UniformSelection:
    """The built-in policy: ``size`` of the clients that may be asked, uniformly
    without replacement; what the server knows of them is not read."""

    def select(self, round: SelectionRound) -> list[int]:
        return uniform_draw(round.among, round.size, round.rng)


def uniform_factory(context: ComponentContext) -> UniformSelection:
    return UniformSelection()


def over_selected(fraction: float, over: float) -> float:
    """The fraction sampled for a round that needs ``fraction`` when ``over`` more
    are asked (a deployment's over-selection; 0: exactly ``fraction``)."""
    return min(1.0, fraction * (1.0 + over)) if over > 0 else fraction

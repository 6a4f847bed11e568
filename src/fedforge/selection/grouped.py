"""``grouped_rotation``: clients in fixed groups that take turns.

The N clients are split once, at the start of the run, into G groups of
near-equal size (a permutation drawn from (seed, "selection_groups"), then cut
into consecutive slices: ``np.array_split``). Cohort t (the t-th upload period)
is drawn from group t mod G: when the group holds more than the cohort's size
among the clients that may be asked, ``size`` of them uniformly without
replacement; when it holds fewer, all of them, and the rest from the next
groups in turn order (the same rule applied to group t+1, t+2, ...). With G
groups every client is asked once in every G cohorts when each group is
about one cohort (G = N / m, the default): a round-robin over a fixed
partition of the population, the "cohort" pattern of cross-device training
where devices check in on a schedule, instead of an independent draw each round.

The grouping depends on the seed and N only, so a rerun, a resume and a
deployment ask the same cohorts; the policy keeps no state of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedforge.config.compat import cohort_size
from fedforge.core.errors import ConfigError
from fedforge.core.rng import numpy_rng
from fedforge.selection.sampling import uniform_draw

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext
    from fedforge.selection.named import SelectionRound

GROUPS_KEY = "selection_groups"  # the purpose key of the grouping's permutation


def make_groups(num_clients: int, groups: int, seed: int) -> list[list[int]]:
    """The fixed groups: a seeded permutation of the ids cut into ``groups``
    slices whose sizes differ by at most one, each slice sorted."""
    order = numpy_rng(seed, GROUPS_KEY).permutation(num_clients)
    return [sorted(int(c) for c in part) for part in np.array_split(order, groups)]


class GroupedRotation:
    """Cohort t from group t mod G, topped up from the following groups."""

    def __init__(self, groups: Sequence[Sequence[int]], every: int = 1) -> None:
        self.groups = [list(g) for g in groups]
        self.every = every  # rounds per upload period: one cohort each

    def turn(self, round_idx: int) -> int:
        """The index of the group whose turn the cohort of ``round_idx`` is."""
        return (round_idx // self.every) % len(self.groups)

    def select(self, round: SelectionRound) -> list[int]:
        available = set(round.among)
        first, chosen = self.turn(round.round_idx), list[int]()
        for step in range(len(self.groups)):
            need = round.size - len(chosen)
            if need <= 0:
                break
            members = [c for c in self.groups[(first + step) % len(self.groups)] if c in available]
            chosen += members if len(members) <= need else uniform_draw(members, need, round.rng)
        return chosen


def factory(context: ComponentContext) -> GroupedRotation:
    cfg = context.cfg
    n = cfg.num_clients
    groups = context.options.groups
    if groups is None:
        groups = max(1, n // cohort_size(n, cfg.client_fraction))
    if groups > n:
        raise ConfigError(
            f"plugin_options.grouped_rotation.groups = {groups} must be at most "
            f"num_clients = {n} (every group holds at least one client)"
        )
    seed = cfg.seed if context.options.seed is None else context.options.seed
    return GroupedRotation(make_groups(n, groups, seed), cfg.communication.upload_every)

"""``fairness_floor``: every client asked at least once in every ``period`` (P)
rounds; within that, uniform.

With upload periods of k rounds (``communication.upload_every``) a cohort is
drawn every k rounds, so P must be a multiple of k and the floor counts
cohorts: q = P / k of them. A client's deadline is the cohort index by which
it must be asked again: its last one plus q (never asked: q - 1). Each cohort
asks first the f clients of earliest deadline, where f is the least number
that keeps every later deadline reachable,

    f = max over j = 0 .. q-1 of (due_j - m j),   due_j = #clients with deadline <= now + j,

(ties drawn at random) and the rest uniformly among the others. With N clients
and cohorts of m, the floor holds from the first round whenever N <= m q (then
f <= m each cohort: shown by induction on the due counts), which the factory
checks; an over-selecting deployment asks more than m, which only helps.
Where fewer clients may be asked than the run's (a deployment's connected
ones), the floor is kept for those there, earliest deadline first: a client
away past its deadline is asked first when it comes back. The guarantee is
therefore for clients that can be reached: in a simulation whose profiles take
clients offline (``systems:``) one offline at every cohort of its window is not
asked in it.
"Asked" is the cohort: a client that then drops out was still asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedforge.config.compat import cohort_size
from fedforge.core.errors import ConfigError
from fedforge.selection.history import NEVER

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext
    from fedforge.selection.named import SelectionRound


class FairnessFloor:
    """The floor of ``cohorts`` cohorts (P / k), a cohort every ``every`` rounds."""

    def __init__(self, cohorts: int, every: int) -> None:
        self.cohorts, self.every = cohorts, every

    def deadlines(self, round: SelectionRound) -> np.ndarray:
        """The cohort index by which each of ``round.among`` must be asked."""
        last = round.history.column("last_asked")[np.asarray(round.among, dtype=np.int64)]
        return np.where(last == NEVER, -1, last // self.every) + self.cohorts

    def forced(self, round: SelectionRound, deadlines: np.ndarray | None = None) -> int:
        """f: how many earliest-deadline clients this cohort must ask (``deadlines``:
        :meth:`deadlines`, where known)."""
        now = round.round_idx // self.every
        due = (self.deadlines(round) if deadlines is None else deadlines) - now
        counts = [int((due <= j).sum()) - round.size * j for j in range(self.cohorts)]
        return min(max(0, *counts), round.size)

    def select(self, round: SelectionRound) -> list[int]:
        pool = list(round.among)
        deadlines = self.deadlines(round)
        f = self.forced(round, deadlines)
        ties = round.rng.permutation(len(pool))  # a random order among equal deadlines
        order = np.lexsort((ties, deadlines))  # by deadline, then ties
        first = [pool[i] for i in order[:f]]
        rest = [pool[i] for i in np.sort(order[f:])]
        drawn = round.rng.choice(len(rest), size=round.size - f, replace=False)
        return [*first, *(rest[int(i)] for i in drawn)]


def factory(context: ComponentContext) -> FairnessFloor:
    cfg = context.cfg
    period, every = context.options.period, cfg.communication.upload_every
    if period % every:
        raise ConfigError(
            f"plugin_options.fairness_floor.period = {period} must be a multiple of "
            f"communication.upload_every = {every} (a cohort is drawn every {every} rounds)"
        )
    m, n = cohort_size(cfg.num_clients, cfg.client_fraction), cfg.num_clients
    if n > m * (period // every):
        raise ConfigError(
            f"plugin_options.fairness_floor.period = {period} cannot ask all {n} clients: "
            f"{period // every} cohort(s) of {m} ask at most {m * (period // every)}; "
            f"use period >= {-(-n // m) * every} or a larger client_fraction"
        )
    return FairnessFloor(period // every, every)

"""``deadline_aware``: ask clients whose last round fitted a deadline, and
explore those never measured.

A client's last duration (``last_duration_s``: its last arrived upload's
seconds from the round's start, on the virtual clock in simulation, measured
in a deployment) against ``deadline_s`` (null: the median of the durations
known) sorts the clients that may be asked into three:

1. unmeasured (never asked, or never arrived): a share ``explore`` of the
   cohort (rounded to the nearest whole client) is drawn uniformly from them,
   so a new or slow-to-report client gets measured;
2. fitting (last duration <= the deadline): the rest of the cohort is drawn
   uniformly from them;
3. when those two run short, the unmeasured not yet drawn (uniformly), then
   the too slow, fastest first.

A client that was asked and never arrived keeps no duration; it stays among
the unmeasured (its dropped count is in its history). The rule reads no
losses: it runs under secure aggregation. Durations are the server's own
observations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext
    from fedforge.selection.named import SelectionRound


def _draw(ids: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
    """``k`` of ``ids`` uniformly without replacement (all of them in draw order
    when ``k`` is their number)."""
    return [ids[int(i)] for i in rng.choice(len(ids), size=min(k, len(ids)), replace=False)]


class DeadlineAware:
    def __init__(self, deadline_s: float | None, explore: float) -> None:
        self.deadline_s, self.explore = deadline_s, explore

    def deadline(self, round: SelectionRound) -> float:
        """The option, or the median duration known (inf when none is)."""
        if self.deadline_s is not None:
            return self.deadline_s
        seconds = round.history.column("last_duration_s")
        known = seconds[~np.isnan(seconds)]
        return float(np.median(known)) if len(known) else float("inf")

    def select(self, round: SelectionRound) -> list[int]:
        limit = self.deadline(round)
        among = np.asarray(round.among, dtype=np.int64)
        took = round.history.column("last_duration_s")[among]
        measured = ~np.isnan(took)
        unmeasured = among[~measured].tolist()
        fitting = among[measured & (took <= limit)].tolist()
        late = np.flatnonzero(measured & (took > limit))
        slow = among[late[np.argsort(took[late], kind="stable")]].tolist()  # fastest first
        explored = _draw(unmeasured, int(np.floor(self.explore * round.size + 0.5)), round.rng)
        picked = explored + _draw(fitting, round.size - len(explored), round.rng)
        if len(picked) < round.size:
            asked = set(explored)
            left = [c for c in unmeasured if c not in asked]
            picked += _draw(left, round.size - len(picked), round.rng)
        return [*picked, *slow[: round.size - len(picked)]]


def factory(context: ComponentContext) -> DeadlineAware:
    return DeadlineAware(context.options.deadline_s, context.options.explore)

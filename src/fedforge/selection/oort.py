"""``oort``: Lai, Zhu, Madhyastha and Chowdhury 2021, "Oort: Efficient Federated
Learning via Guided Participant Selection" (OSDI '21), Algorithm 1, as far as
what the server knows of each client (selection/history.py) permits.

A client heard from (its update taken with a loss: *explored*) scores

    u_i   = U_i / max_j U_j + sqrt(staleness * ln R / L_i)
    score = u_i * (T / t_i) ** alpha    when t_i > T, else u_i

- U_i, the statistical utility, is the paper's |B_i| sqrt(mean_k loss_k^2) over
  the client's samples; the server has its example count n_i and one reported
  mean training loss, so U_i = n_i * last_loss (exact when every sample's loss
  is the mean). U is divided by the largest among the clients that may be asked
  (the paper's code normalises before adding the bonus; a max-scaling here).
- The staleness bonus: R the round (from 1), L_i the round (from 1) the client's
  update was last taken: the longer ago, the larger, so a client not tried
  recently comes back.
- t_i: the seconds its last arrived upload took (``last_duration_s``); T, the
  developer's preferred round duration (``preferred_duration_s``), or else the
  ``duration_percentile``-th percentile of the durations known; alpha: ``penalty``.
  A client never measured takes no penalty.
- The pacer: when the exploited utility of the last ``pacer_window`` rounds is
  within 10% of the window before (stalled), the percentile T is drawn at rises
  by ``pacer_delta`` (more slow clients allowed in). Deviation: the paper keeps
  the utility of each round and lets the relaxations accumulate; a policy here
  keeps no state (resume exactness), so the windows are those clients' last
  uses as the history holds them and the step is one, this round only. A fixed
  ``preferred_duration_s`` is not paced.
- Exploration: a share epsilon = max(exploration * decay ** round, min) of the
  cohort goes to clients never heard from, faster first (drawn with weights
  1 / t_i where measured, the median such weight where not); the rest is
  exploited: drawn, with probabilities proportional to score, among the
  explored whose score is at least ``cut_off`` times the score ranked at the
  exploited count (the paper's confidence cut-off). Either part too small: the
  other fills the cohort.
- Outliers: U_i is at least 0 (a negative or non-finite claim counts 0) and at
  most the ``utility_percentile``-th percentile of the explored clients' U (the
  paper's clipping; the lower of the two values around it), so a client that
  claims a huge loss or example count is scored as the clients near the top,
  not above them all.
- Refused clients: a client never taken (no update of it in any model) whose
  uploads were refused ``explore_refusals`` times (default 2) is no longer
  explored: its loss never
  becomes known, so without this it would take an exploration slot every round
  it is drawn. It is asked only when the explored and the explorable cannot
  fill the cohort, the fewest refusals first (ties: the lower id).
- The blacklist (off by default, as in the authors' code): with
  ``blacklist_rounds`` set, a client asked in more than that many rounds is
  left out of the round, the most-asked first (ties: the lower id), at most
  ``blacklist_max_share`` of the clients that may be asked, and never so many
  that the cohort cannot be filled.

It reads the reported losses (``reads_losses``): refused where the run's
privacy keeps them from the server (secure aggregation).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import reduce
from operator import add
from typing import TYPE_CHECKING

import numpy as np

from fedforge.selection.history import NEVER
from fedforge.selection.options import OortOptions

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext
    from fedforge.selection.history import ClientHistories
    from fedforge.selection.named import SelectionRound

STALLED = 0.1  # the pacer's relative change of utility below which it relaxes T


def utility(history: ClientHistories, client_id: int) -> float:
    """U_i = n_i * last_loss: the statistical utility of an explored client (0
    where the product is negative or not finite)."""
    row = history[client_id]
    u = float(row.num_examples) * float(row.last_loss or 0.0)
    return u if math.isfinite(u) and u > 0 else 0.0


def utilities(history: ClientHistories) -> np.ndarray:
    """:func:`utility` of every client, by id (0 where never heard from)."""
    loss = history.column("last_loss")
    with np.errstate(over="ignore", invalid="ignore"):
        u = history.column("num_examples").astype(np.float64) * np.where(np.isnan(loss), 0.0, loss)
    return np.where(np.isfinite(u) & (u > 0), u, 0.0)


def _sum(values: np.ndarray) -> float:
    """The sum of ``values`` added one by one in order (as a loop over clients)."""
    return float(reduce(add, values.tolist(), 0.0))


class Oort:
    reads_losses = True

    def __init__(self, options: OortOptions) -> None:
        self.o = options

    def exploration_at(self, round_idx: int) -> float:
        """epsilon of round ``round_idx`` (0-based): decayed once a round."""
        o = self.o
        return max(o.exploration * o.exploration_decay**round_idx, o.exploration_min)

    def stalled(self, round: SelectionRound) -> bool:
        """Whether the utility taken in the last window is within 10% of the one before."""
        w, now = self.o.pacer_window, round.round_idx
        if now < 2 * w:
            return False
        used = round.history.column("last_used")
        heard = (used != NEVER) & ~np.isnan(round.history.column("last_loss"))
        u = utilities(round.history)
        recent = _sum(u[heard & (now - w <= used) & (used < now)])
        before = _sum(u[heard & (now - 2 * w <= used) & (used < now - w)])
        return before > 0 and abs(recent - before) <= STALLED * before

    def preferred_duration(self, round: SelectionRound) -> float:
        """T: the option, or the (paced) percentile of the durations known; inf: none."""
        if self.o.preferred_duration_s is not None:
            return self.o.preferred_duration_s
        seconds = round.history.column("last_duration_s")
        known = seconds[~np.isnan(seconds)]
        if not len(known):
            return math.inf
        q = self.o.duration_percentile + (self.o.pacer_delta if self.stalled(round) else 0.0)
        return float(np.percentile(known, min(q, 100.0)))

    def scores(self, round: SelectionRound) -> dict[int, float]:
        """The score of each explored client among those that may be asked."""
        h, among = round.history, np.asarray(round.among, dtype=np.int64)
        explored = among[~np.isnan(h.column("last_loss")[among])]
        if not len(explored):
            return {}
        raw = utilities(h)[explored]
        # the percentile taken at a value held (the lower of the two around it), so
        # that one outlier among twenty is cut to the largest of the rest
        cap = float(np.percentile(raw, self.o.utility_percentile, method="lower"))
        clipped = np.minimum(raw, cap)
        top = float(clipped.max())
        T, log_r = self.preferred_duration(round), math.log(round.round_idx + 1)
        u = clipped / top if top > 0 else np.zeros(len(explored))
        used = h.column("last_used")[explored]
        last = np.where(used == NEVER, 0, used).astype(np.float64) + 1  # from round 1
        u += np.sqrt(self.o.staleness * log_r / last)
        took = h.column("last_duration_s")[explored]
        with np.errstate(invalid="ignore"):
            slow = np.flatnonzero(took > T)  # NaN: never measured, no penalty
        for i in slow.tolist():  # Python's pow, as a client's own score
            u[i] = float(u[i]) * (T / float(took[i])) ** self.o.penalty
        return dict(zip(explored.tolist(), u.tolist(), strict=True))

    def blacklisted(self, round: SelectionRound) -> set[int]:
        """The clients asked too often to be asked this round (none without
        ``blacklist_rounds``)."""
        o = self.o
        if o.blacklist_rounds is None:
            return set()
        asked = round.history.column("asked")
        over = [c for c in round.among if asked[c] > o.blacklist_rounds]
        room = min(
            math.floor(o.blacklist_max_share * len(round.among) + 1e-9),
            len(round.among) - round.size,
        )
        return set(sorted(over, key=lambda c: (-int(asked[c]), c))[: max(room, 0)])

    def select(self, round: SelectionRound) -> list[int]:
        banned = self.blacklisted(round)
        if banned:
            round = dataclasses.replace(round, among=[c for c in round.among if c not in banned])
        scores = self.scores(round)
        refused = round.history.column("refused")
        unheard = [c for c in round.among if c not in scores]
        used = round.history.column("used")
        fresh = [c for c in unheard if refused[c] < self.o.explore_refusals or used[c] > 0]
        share = 1 - self.exploration_at(round.round_idx)
        exploit = min(math.floor(round.size * share + 1e-9), len(scores))
        explore = min(round.size - exploit, len(fresh))
        exploit = min(round.size - explore, len(scores))  # the explored fill what the fresh cannot
        shunned = sorted(set(unheard) - set(fresh), key=lambda c: (refused[c], c))
        return [
            *self._exploit(scores, exploit, round.rng),
            *self._explore(round, fresh, explore),
            *shunned[: round.size - exploit - explore],
        ]

    def _exploit(self, scores: dict[int, float], k: int, rng: np.random.Generator) -> list[int]:
        """``k`` explored clients by score, among those above the cut-off."""
        if k == 0:
            return []
        ranked = sorted(scores, key=lambda c: (-scores[c], c))
        bar = self.o.cut_off * scores[ranked[k - 1]]
        pool = [c for c in ranked if scores[c] >= bar]
        weights = np.array([scores[c] for c in pool])
        if np.count_nonzero(weights) < k:  # too few with a score: the best ones
            return ranked[:k]
        picked = rng.choice(len(pool), size=k, replace=False, p=weights / weights.sum())
        return [pool[int(i)] for i in picked]

    def _explore(self, round: SelectionRound, fresh: Sequence[int], k: int) -> list[int]:
        """``k`` clients never heard from, faster ones (by last duration) likelier."""
        if k == 0:
            return []
        took = round.history.column("last_duration_s")[np.asarray(fresh, dtype=np.int64)]
        with np.errstate(invalid="ignore"):
            timed = took > 0  # NaN: never measured
        known = 1.0 / took[timed]
        default = float(np.median(known)) if len(known) else 1.0
        w = np.full(len(fresh), default)
        w[timed] = known
        picked = round.rng.choice(len(fresh), size=k, replace=False, p=w / w.sum())
        return [fresh[int(i)] for i in picked]


def factory(context: ComponentContext) -> Oort:
    return Oort(context.options)

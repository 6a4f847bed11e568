"""The simulator's synchronous round on the virtual clock (systems/): which
clients are online at the round's start (the sampling pool), which of the
asked fail (``failure_prob``, drawn from (seed, round)), and, once the engine
has run the others, when each upload would arrive: its time from its profile,
the payload's and its update's real encoded bytes and the examples its local
work processed (systems/clock.py). The uploads that arrive in time are offered
to the collector in arrival order; the others are the collector's dropouts,
as a deployment reports clients that went silent: their updates never reach
the model. The clock is bookkeeping on numbers the round has: the same work
is trained as without it, less the failed clients'.

Its state is the virtual time at the end of each round so far
(``LoopState.virtual_s``, checkpointed); availability is a function of (seed,
client, time), so a resumed run's rounds are the same.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from fedforge.algorithms.plan import LocalPlan
from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config.compat import cohort_size
from fedforge.core.rng import numpy_rng
from fedforge.server.collectors import Collector
from fedforge.server.experiment import Experiment
from fedforge.server.state import LoopState
from fedforge.systems.clock import ClientTime, client_time, close_round
from fedforge.systems.population import Systems


class RoundClock:
    """One round on the virtual clock, from its start at ``start_s``."""

    def __init__(self, exp: Experiment, systems: Systems, round_idx: int, start_s: float) -> None:
        self.exp, self.systems, self.round_idx, self.start_s = exp, systems, round_idx, start_s
        self.cohort: list[int] = []
        self.failed: set[int] = set()
        self.times: dict[int, ClientTime] = {}
        self.arrived: list[int] = []
        self.duration_s = 0.0
        self.online = 0
        self.plans: dict[int, LocalPlan] = {}
        self._payload_bytes = 0

    def pool(self, among: list[int] | None) -> list[int]:
        """The clients online at the round's start (of ``among``; None: all)."""
        avail, t = self.systems.availability, self.start_s
        ids = range(self.exp.cfg.num_clients) if among is None else among
        found = [c for c in ids if avail.online(c, t)]
        self.online = len(found)
        return found

    def target(self) -> int:
        """The uploads the round waits for: K, or every asked client."""
        cfg = self.exp.cfg
        if self.systems.over_selection > 0:
            return min(cohort_size(cfg.num_clients, cfg.client_fraction), len(self.cohort))
        return len(self.cohort)

    def without_failed(
        self, cohort: list[int], tasks: list[ClientTask], payload_bytes: int
    ) -> list[ClientTask]:
        """The tasks of the asked clients that do not fail this round (each asked
        client downloads ``payload_bytes``)."""
        self.cohort, self._payload_bytes = list(cohort), payload_bytes
        self.plans = {t.client_id: t.plan for t in tasks}
        draws = numpy_rng(self.exp.cfg.seed, "failure", self.round_idx).random(len(cohort))
        chance = [self.systems.profiles[c].failure_prob for c in cohort]
        self.failed = {c for c, u, p in zip(cohort, draws.tolist(), chance, strict=True) if u < p}
        return [t for t in tasks if t.client_id not in self.failed]

    def arrivals(
        self, uploads: Iterable[ClientUpload], collector: Collector
    ) -> Iterator[ClientUpload]:
        """The uploads that arrive in time, in arrival order; the collector is told
        of the others as dropouts."""
        sizes, plans, payload = self.exp.client_sizes(), self.plans, self._payload_bytes
        got = {u.client_id: u for u in uploads}
        avail, profiles = self.systems.availability, self.systems.profiles
        totals: dict[int, float] = {}
        offline: dict[int, float] = {}
        for c, up in got.items():
            examples = plans[c].local_epochs * int(sizes[c])
            self.times[c] = client_time(profiles[c], payload, len(up.data), examples)
            totals[c] = self.times[c].total_s
            offline[c] = avail.online_until(c, self.start_s) - self.start_s
        end = close_round(totals, offline, self.target(), self.systems.deadline_s)
        self.duration_s, self.arrived = end.duration_s, end.taken
        for c in sorted(end.dropped):
            collector.dropout(c)
        return iter([got[c] for c in end.taken])

    def rows(self) -> dict[str, list[tuple[Any, ...]]]:
        """The round's rows of the ``client_times`` and ``round_clock`` tables."""
        r, came = self.round_idx, set(self.arrived)
        times: list[tuple[Any, ...]] = []
        for c in self.cohort:
            t = self.times.get(c)
            if t is None:  # failed, or a dropped straggler: only the download is known
                down = client_time(self.systems.profiles[c], self._payload_bytes, 0, 0)
                times.append((r, c, down.download_s, None, None, None, 0))
            else:
                row = (r, c, t.download_s, t.compute_s, t.upload_s, t.total_s, int(c in came))
                times.append(row)
        end = self.start_s + self.duration_s
        clock: list[tuple[Any, ...]] = [
            (r, self.start_s, self.duration_s, end, self.online, len(self.cohort), len(came))
        ]
        return {"client_times": times, "round_clock": clock}

    def durations(self) -> dict[int, float]:
        """The seconds each arrived upload took: what the server measures."""
        return {c: self.times[c].total_s for c in self.arrived}

    def idle_until(self) -> float:
        """A round with nobody online: the seconds until the first client comes online."""
        avail, t = self.systems.availability, self.start_s
        first = min(avail.next_online(c, t) for c in range(self.exp.cfg.num_clients))
        return first - t if math.isfinite(first) else 0.0


def round_clock(exp: Experiment, state: LoopState, round_idx: int) -> RoundClock | None:
    """The round's clock: None without ``systems:`` profiles, or in a deployment
    (its clients' times are real)."""
    if exp.systems is None or exp.engine.name == "remote":
        return None
    return RoundClock(exp, exp.systems, round_idx, state.virtual_now)


def advance(state: LoopState, clock: RoundClock) -> None:
    """The round is over: the virtual time moves on by its duration."""
    state.virtual_s.append(clock.start_s + clock.duration_s)
    state.outputs.update(clock.rows())

"""When each client can be reached, as a function of virtual time.

Either a two-state on/off process (a continuous-time Markov chain: online
spells exponential of mean ``mean_online_s``, offline spells of mean
``mean_offline_s``, the first state drawn from the stationary law, so the
client is online a fraction on / (on + off) of the time), optionally within a
daily window (``daily_hours`` a day, starting at a per-client time of day:
the hours a phone is idle and charging), the two independent; or a trace of
online intervals (systems/trace.py) in their place.

Everything derives from (seed, client, spell block): a client's spells are
drawn in blocks of :data:`BLOCK` as far as the question asks, so the answer
at any time is the same whatever was asked before. Nothing here is state a
checkpoint must keep: a resumed run asks the same questions and gets the same
answers.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from fedforge.core.rng import numpy_rng
from fedforge.systems.profile import ClientProfile

DAY_S = 86_400.0
BLOCK = 64  # spells drawn at a time


class Availability:
    """Whether each client is online at a virtual time, and for how long."""

    def __init__(
        self,
        seed: int,
        profiles: Sequence[ClientProfile],
        daily_hours: float = 24.0,
        trace: tuple[dict[int, list[tuple[float, float]]], float] | None = None,
    ) -> None:
        self.seed, self.profiles = seed, list(profiles)
        self.window_s = daily_hours * 3600.0
        self.trace = trace
        self._changes: dict[int, list[float]] = {}  # the spells' ends, as far as drawn
        self._first_on: dict[int, bool] = {}
        self._phase: dict[int, float] = {}

    # the on/off process
    def _spells_to(self, c: int, t: float) -> list[float]:
        """Client ``c``'s state changes, drawn at least past ``t``."""
        changes = self._changes.get(c)
        p = self.profiles[c]
        if changes is None:
            on = p.mean_online_s / (p.mean_online_s + p.mean_offline_s)
            self._first_on[c] = bool(numpy_rng(self.seed, "availability", c).random() < on)
            changes = self._changes[c] = []
        while not changes or changes[-1] <= t:
            block = len(changes) // BLOCK
            draws = numpy_rng(self.seed, "availability", c, block).standard_exponential(BLOCK)
            at = changes[-1] if changes else 0.0
            for i, x in enumerate(draws.tolist()):
                on = self._first_on[c] == ((block * BLOCK + i) % 2 == 0)
                at += x * (p.mean_online_s if on else p.mean_offline_s)
                changes.append(at)
        return changes

    def _markov(self, c: int, t: float) -> tuple[bool, float]:
        """Whether the process is on at ``t``, and when it next changes."""
        if self.profiles[c].always_online:
            return True, math.inf
        changes = self._spells_to(c, t)
        i = bisect.bisect_right(changes, t)
        return self._first_on[c] == (i % 2 == 0), changes[i]

    # the daily window
    def _window(self, c: int, t: float) -> tuple[bool, float]:
        """Whether ``t`` is in the client's daily window, and when that next changes."""
        if self.window_s >= DAY_S:
            return True, math.inf
        phase = self._phase.get(c)
        if phase is None:
            phase = self._phase[c] = float(numpy_rng(self.seed, "daily", c).random()) * DAY_S
        # day k's window opens at phase + k DAY_S and closes window_s later, each edge
        # computed by the one formula wherever it is asked: the edges are exact
        k = math.floor((t - phase) / DAY_S)
        if t >= phase + (k + 1) * DAY_S:  # the division rounded down across an edge
            k += 1
        elif t < phase + k * DAY_S:
            k -= 1
        closes = phase + k * DAY_S + self.window_s
        if t < closes:
            return True, closes
        return False, phase + (k + 1) * DAY_S

    # the trace
    def _traced(self, c: int, t: float) -> tuple[bool, float]:
        assert self.trace is not None
        spans, period = self.trace
        mine = spans.get(c, [])
        if not mine:
            return False, math.inf
        base = math.floor(t / period) * period
        local = t - base
        i = bisect.bisect_right([s for s, _ in mine], local) - 1
        if i >= 0 and local < mine[i][1]:
            return True, base + mine[i][1]
        nxt = mine[i + 1][0] if i + 1 < len(mine) else period + mine[0][0]
        return False, base + nxt

    def state(self, c: int, t: float) -> tuple[bool, float]:
        """Whether client ``c`` is online at ``t``, and the next time that may change."""
        if self.trace is not None:
            return self._traced(c, t)
        on, change = self._markov(c, t)
        inside, edge = self._window(c, t)
        if on and inside:
            return True, min(change, edge)
        if on:  # waiting for the window
            return False, edge
        if inside:
            return False, change
        return False, max(change, edge)

    def online(self, c: int, t: float) -> bool:
        return self.state(c, t)[0]

    def online_until(self, c: int, t: float) -> float:
        """When client ``c``, online at ``t``, goes offline (inf: never)."""
        on, until = self.state(c, t)
        return until if on else t

    def next_online(self, c: int, t: float, limit: int = 10_000) -> float:
        """The first time >= ``t`` at which client ``c`` is online (inf: never, as
        far as ``limit`` state changes show)."""
        for _ in range(limit):
            on, change = self.state(c, t)
            if on:
                return t
            if math.isinf(change):
                return math.inf
            t = change
        return math.inf

    def fraction(self, c: int) -> float:
        """The long-run fraction of time client ``c`` is online."""
        if self.trace is not None:
            spans, period = self.trace
            return sum(e - s for s, e in spans.get(c, [])) / period
        p = self.profiles[c]
        markov = 1.0 if p.always_online else p.mean_online_s / (p.mean_online_s + p.mean_offline_s)
        return markov * min(1.0, self.window_s / DAY_S)


def online_fraction(avail: Availability, c: int, horizon_s: float, samples: int) -> float:
    """The fraction of ``samples`` evenly spaced times in [0, horizon_s) at which
    client ``c`` is online (a check of :meth:`Availability.fraction`)."""
    times = np.linspace(0.0, horizon_s, samples, endpoint=False)
    return float(np.mean([avail.online(c, float(t)) for t in times]))


__all__ = ["DAY_S", "Availability", "online_fraction"]

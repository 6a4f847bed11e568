"""The server's log of refused calls, at a bounded rate per peer address.

Every refusal is counted (the caller's metrics); the log says each peer
address's first ``first`` refusals of a window of ``window_s`` seconds in full,
and at the window's end one line per address with how many more it had (and the
last reason). A window holds at most ``lines`` full lines and ``lines`` count
lines over all addresses (the counts of further addresses are summed in one
more line), so however many calls peers make, and from however many addresses,
the log grows by at most ``2 * lines + 1`` lines a window: 101 lines per 10 s
with the defaults. What it remembers is bounded likewise: the addresses said in
full (at most ``lines``) and those held back (at most ``HELD_ADDRESSES``; the
calls of further addresses counted together).

Refusals come from the server's event loop (``admission.py``): no lock; the
window's end is a timer on that loop (with no loop running, the next refusal
after it closes the window).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW_S = 10.0
FIRST = 3  # refusals of one address said in full each window
LINES = 50  # full lines a window, over all addresses; count lines likewise
HELD_ADDRESSES = 4096  # addresses whose refusals are counted apart in a window
OTHERS = "other addresses"

# (sender, peer address, reason, how many refusals the line stands for)
Say = Callable[[str, str, str, int], None]


@dataclass
class RefusalLog:
    """Says refusals through ``say``: the first few of each address in full,
    then a count per address and window."""

    say: Say
    window_s: float = WINDOW_S
    first: int = FIRST
    lines: int = LINES
    clock: Callable[[], float] = time.monotonic
    _start: float | None = None
    _full: dict[str, int] = field(default_factory=dict)  # address -> lines said this window
    _said: int = 0
    _held: dict[str, tuple[int, str]] = field(default_factory=dict)  # address -> (count, last)
    _timer: asyncio.TimerHandle | None = None

    def refused(self, who: str, where: str, reason: str) -> None:
        """One refusal of a call from address ``where`` (``who``: the name it
        claimed or was proven, if any)."""
        now = self.clock()
        if self._start is None or now - self._start >= self.window_s:
            self.flush()
            self._start = now
        full = self._full.get(where, 0)
        if full < self.first and self._said < self.lines:
            self._full[where] = full + 1
            self._said += 1
            self.say(who, where, reason, 1)
            return
        if where not in self._held and len(self._held) >= HELD_ADDRESSES:
            where = OTHERS
        count, _ = self._held.get(where, (0, ""))
        self._held[where] = (count + 1, reason)
        self._close_later()

    def flush(self) -> None:
        """Close the window: say the counts held back (the largest first), then
        begin a new one."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held = sorted(self._held.items(), key=lambda item: -item[1][0])
        for where, (count, last) in held[: self.lines]:
            why = f"{count} more refusals in {self.window_s:g} s, the last: {last}"
            self.say("?", where, why, count)
        rest = held[self.lines :]
        if rest:
            count = sum(c for _, (c, _) in rest)
            self.say("?", OTHERS, f"{count} more refusals from {len(rest)} more addresses", count)
        self._held.clear()
        self._full.clear()
        self._said = 0
        self._start = None

    def _close_later(self) -> None:
        if self._timer is not None or self._start is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: the next refusal after the window closes it
            return
        left = max(0.0, self._start + self.window_s - self.clock())
        self._timer = loop.call_later(left, self.flush)

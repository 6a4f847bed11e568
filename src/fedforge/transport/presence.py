"""Who is there: the deployment server's view of each client process's
connection, from the calls its session makes.

A client process has a call open to the server most of the time: its long poll
while it waits for work, and while it works, its heartbeat, which the server
holds open (up to ``HOLD_S``, ending a second before the call's own deadline)
when no long poll of the session is open. When the process dies its connection
closes, and gRPC ends the open call as cancelled: the callback registered with
``context.add_callback`` runs while the handler is still inside the call, which
a call that ended normally never does. The session is then gone at once
("hung up"), long before the heartbeat timeout.

Between two calls (the pause of its heartbeat loop) nothing is open to close.
A session that stays quiet longer than ``QUIET_FACTOR`` times the longest pause
it has shown between one heartbeat's end and the next one's start, plus
``QUIET_SLACK_S``, is gone too; before it has shown one, its pause is taken to
be ``ASSUMED_PAUSE_S`` (a client's default heartbeat interval). The heartbeat
timeout bounds both. Any new call from a gone session brings it back.

Nothing here locks: the hub (``hub.py``) calls it under its own lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

HOLD_S = 8.0  # a heartbeat is held open at most this long
DEADLINE_MARGIN_S = 1.0  # ... and ends this long before the call's deadline
QUIET_FACTOR = 3.0
QUIET_SLACK_S = 1.0
PAUSE_DECAY = 0.9  # the remembered pause shrinks by this factor per heartbeat
ASSUMED_PAUSE_S = 2.0  # a session's pause before it has shown one (client.py's default)


class CallContext(Protocol):
    """What the hub needs of a gRPC call (``grpc.ServicerContext`` has both)."""

    def add_callback(self, callback: Callable[[], None]) -> bool: ...

    def time_remaining(self) -> float | None: ...


def hold_seconds(call: CallContext | None) -> float:
    """How long a heartbeat ``call`` may be held open (0 without a call: unit
    callers and clients whose deadline is too near)."""
    if call is None:
        return 0.0
    left = call.time_remaining()
    if left is None:
        return HOLD_S
    return max(0.0, min(HOLD_S, left - DEADLINE_MARGIN_S))


@dataclass
class Line:
    """One session's calls as the server has seen them."""

    last: float  # the latest start or end of one of its calls (or its join)
    open: dict[int, bool] = field(default_factory=dict)  # call -> a heartbeat not held
    beat_end: float | None = None  # when its last heartbeat not held open ended
    pause: float | None = None  # the longest recent pause between two heartbeats
    hung_up: bool = False  # a call was ended by the client's side: the process is gone


class Presence:
    """The lines of every session: which are live."""

    def __init__(self, heartbeat_timeout_s: float) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.lines: dict[str, Line] = {}
        self._next = 0

    def joined(self, session: str, now: float) -> None:
        self.lines[session] = Line(now)

    def forget(self, session: str) -> None:
        self.lines.pop(session, None)

    def opened(self, session: str, heartbeat: bool, now: float, held: bool = False) -> int:
        """A call of ``session`` begins (``held``: a heartbeat the hub holds open):
        its id (``closed`` and ``hung_up`` name it). The pause before a heartbeat
        is learnt after one that was not held (a client sends the next one held
        at once: that is no pause of its loop)."""
        line = self.lines.setdefault(session, Line(now))
        if heartbeat and line.beat_end is not None:
            gap = now - line.beat_end
            line.pause = gap if line.pause is None else max(gap, line.pause * PAUSE_DECAY)
        if heartbeat:
            line.beat_end = None
        line.hung_up = False  # it called: it is there
        line.last = now
        self._next += 1
        line.open[self._next] = heartbeat and not held
        return self._next

    def closed(self, session: str, call: int, now: float) -> None:
        """The handler of ``call`` returned (its answer goes out)."""
        line = self.lines.get(session)
        if line is None or call not in line.open:
            return
        if line.open.pop(call):
            line.beat_end = now
        line.last = max(line.last, now)

    def hung_up(self, session: str, call: int) -> bool:
        """gRPC ended ``call``: when its handler had not returned yet, the client's
        side closed it (the process died or gave up on it); True then."""
        line = self.lines.get(session)
        if line is None or call not in line.open:
            return False
        del line.open[call]
        line.hung_up = True
        return True

    def is_hung_up(self, session: str) -> bool:
        line = self.lines.get(session)
        return line is not None and line.hung_up

    def polling(self, session: str) -> bool:
        """Whether a call of ``session`` other than a quick heartbeat is open (a long
        poll, or a held heartbeat)."""
        line = self.lines.get(session)
        return line is not None and not all(line.open.values())

    def live(self, session: str, now: float) -> bool:
        """Whether ``session``'s process is there: not hung up, and a call open or
        one ended lately (within the heartbeat timeout and its own pauses)."""
        line = self.lines.get(session)
        if line is None or line.hung_up:
            return False
        if line.open:
            return True
        quiet = now - line.last
        if quiet >= self.heartbeat_timeout_s:
            return False
        pause = ASSUMED_PAUSE_S if line.pause is None else line.pause
        return quiet <= QUIET_FACTOR * pause + QUIET_SLACK_S

    def live_until(self, session: str) -> float | None:
        """When ``session`` stops (or stopped) counting as there if it makes no
        call: its last call's end plus the quiet it is allowed (``live``'s rule);
        None for an unknown session or one with a call open."""
        line = self.lines.get(session)
        if line is None or line.open:
            return None
        pause = ASSUMED_PAUSE_S if line.pause is None else line.pause
        return line.last + min(self.heartbeat_timeout_s, QUIET_FACTOR * pause + QUIET_SLACK_S)


__all__ = ["CallContext", "HOLD_S", "Presence", "hold_seconds"]

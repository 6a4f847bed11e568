"""Where the deployment server's polls wait: on the gRPC event loop, never in a
thread.

A long poll waits up to a minute for work, and a heartbeat is held open up to
``presence.HOLD_S``; were each to hold a thread of the hub's pool, a few hundred
waiting calls would take them all, and a Join, an Upload or the next heartbeat
would queue behind them. Here a waiting call costs a coroutine: it takes a
short step at the hub (``polls.py``: on the pool, under the hub's lock), and
between steps awaits a wake-up, which the hub rings (``Hub.on_wake``, from any
thread) whenever pollers may have news, or its time running out.

At most ``max_waiting`` calls wait at once (``deployment.max_waiting_calls``);
past it a poll is told RESOURCE_EXHAUSTED, which a client backs off from
(``backoff.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

import grpc

from fedforge.transport.guard import Refused


class Waits:
    """The calls waiting on one event loop, and their wake-up."""

    def __init__(
        self,
        max_waiting: int,
        refuse: Callable[[str, str], Refused] = lambda who, why: Refused(
            grpc.StatusCode.RESOURCE_EXHAUSTED, why, who
        ),
    ) -> None:
        self.max_waiting, self.refuse = max_waiting, refuse
        self.waiting = 0  # calls waiting now (read and changed on the loop alone)
        self.peak = 0  # the most that waited at once
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bell: asyncio.Event | None = None

    def bell(self) -> asyncio.Event:
        """The wake-up a caller awaits next; taken before it looks at the hub, so
        that news after its look rings it (called on the loop)."""
        if self._bell is None:
            self._loop = asyncio.get_running_loop()
            self._bell = asyncio.Event()
        return self._bell

    def ring(self) -> None:
        """Wake every waiting call (from any thread; never blocks)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._ring)

    def _ring(self) -> None:
        bell, self._bell = self._bell, asyncio.Event()
        if bell is not None:
            bell.set()

    @staticmethod
    async def until(bell: asyncio.Event, timeout_s: float) -> None:
        """Until ``bell`` rings or ``timeout_s`` passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(bell.wait(), max(0.0, timeout_s))

    @contextlib.contextmanager
    def held(self, who: str) -> Iterator[None]:
        """A call of ``who`` waiting (Refused: ``max_waiting`` are)."""
        if self.waiting >= self.max_waiting:
            raise self.refuse(
                who,
                f"the server holds {self.max_waiting} waiting calls already "
                "(deployment.max_waiting_calls); try again later",
            )
        self.waiting += 1
        self.peak = max(self.peak, self.waiting)
        try:
            yield
        finally:
            self.waiting -= 1


__all__ = ["Waits"]

"""A client process's updates on their way to the server.

The server answers an update's upload with the round's verdict, which may come
only at the round's end (a round that judges its uploads together: the first
round's bound by the median of its own norms, a cohort stage), when every
client of the cohort has uploaded: this process's other clients among them. So
each update is sent from a thread of its own while the process trains the
next, and all are awaited before the next poll.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class InFlight:
    """Uploads sent in the background, at most ``width`` at once (a process's
    clients: the most one round asks of it)."""

    def __init__(self, width: int) -> None:
        self._pool = ThreadPoolExecutor(max(1, width), thread_name_prefix="upload")
        self._sent: list[Future[None]] = []

    def send(self, upload: Callable[[], None]) -> None:
        self._sent.append(self._pool.submit(upload))

    def wait(self) -> None:
        """Wait for every upload sent; the first one's failure (e.g. the server
        lost: join again) is raised once all are done."""
        sent, self._sent = self._sent, []
        failures = [exc for f in sent if (exc := f.exception()) is not None]
        if failures:
            raise failures[0]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["InFlight"]

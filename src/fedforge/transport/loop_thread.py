"""An asyncio event loop in a thread of its own: the deployment server's gRPC
(``grpc.aio``) lives there, while the rounds run on the main thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A running event loop, and a way to run coroutines on it from elsewhere."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """``coro``'s result, run on the loop (its exception, raised here)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self, drain_s: float = 5.0) -> None:
        """Stop the loop and wait for its thread; the tasks still on it (a call's
        handler ending its poll at the hub) are cancelled and given ``drain_s``
        to end first, so none is left pending when the loop closes."""
        if self._thread.is_alive():
            with contextlib.suppress(TimeoutError):
                self.run(_drain(drain_s), drain_s + 1.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


async def _drain(timeout_s: float) -> None:
    """Cancel the loop's other tasks and wait up to ``timeout_s`` for them to end."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)

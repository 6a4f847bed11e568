"""Idle upload streams: the thread-pool gRPC server gives every open call a
thread, so a peer that opens an upload stream and then sends nothing would hold
one for as long as it likes. :class:`IdleStreams` watches the open streams from
one daemon thread and cancels a stream whose peer has sent no part for the
deployment's silence limit (``deployment.heartbeat_timeout_s``, the same silence
after which a client counts as gone); the cancelled call's handler sees its
iterator fail and returns, and its thread goes back to the pool."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import TypeVar

import grpc

T = TypeVar("T")


class IdleStreams:
    """The open upload streams and when each last sent a part."""

    def __init__(self, limit_s: float, tick_s: float = 0.5) -> None:
        self.limit_s, self.tick_s = limit_s, min(tick_s, limit_s / 2)
        self._open: dict[int, tuple[grpc.ServicerContext, float]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.cancelled = 0  # streams cancelled for silence

    def watch(self, context: grpc.ServicerContext, parts: Iterator[T]) -> Iterator[T]:
        """``parts`` as they arrive, the stream cancelled when they stop coming."""
        key = next(self._ids)
        self._touch(key, context)
        try:
            for part in parts:
                self._touch(key, context)
                yield part
        finally:
            with self._lock:
                self._open.pop(key, None)

    def _touch(self, key: int, context: grpc.ServicerContext) -> None:
        with self._lock:
            self._open[key] = (context, time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="idle-streams", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.tick_s)
            now = time.monotonic()
            with self._lock:
                silent = [k for k, (_, t) in self._open.items() if now - t > self.limit_s]
                calls = [self._open.pop(k)[0] for k in silent]
            for context in calls:
                self.cancelled += 1
                context.cancel()

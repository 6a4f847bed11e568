"""The run page's live feed: server-sent events from one run folder.

A :class:`RunWatcher` holds one read-only connection to the run's store and,
every ``POLL_S``, asks it one cheap question (:meth:`RunStore.rounds_mark`: row
count, last round, newest write); only when the answer changed does it read the
new rows. It also looks at SQLite's ``data_version`` (any commit: an alert
recorded after its round), the live-state file's modification time and the
run's status. Each poll runs in a worker thread (:func:`run_events`), never on
the event loop: a run with many refusals takes a while to read. The events
(each ``data`` a JSON object):

- ``rounds``: ``{"reset": true, "rows": [...all]}`` first and whenever rows
  already sent changed (a resumed run rewound), else ``{"reset": false, "rows":
  [...new]}``;
- ``status``: status, rounds done and planned, best accuracy (when changed);
- ``anomalies``: refused updates by reason (when the rounds changed);
- ``alerts``: the alerts fired (when they changed);
- ``live``: the deployment server's state, judged here (:func:`live_view`: its
  age and condition), when its file changed and every ``LIVE_EVERY_S`` besides
  (the age grows; a server gone silent turns stale with no file written).

At most ``MAX_FEEDS`` feeds are open at once (:class:`Feeds`): each holds a
connection to its run's store and a worker thread's poll every ``POLL_S``, so a
reader past the bound is told so in a ``failure`` event instead.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from fedforge.core.errors import StoreError
from fedforge.report.dashboard.data import (
    alerts_view,
    anomaly_view,
    live_view,
    round_rows,
    status_view,
)
from fedforge.store.live_state import live_path, read_live_state
from fedforge.store.runstore import RunStore

POLL_S = 0.3
KEEPALIVE_S = 15.0  # a comment line now and then: a gone reader is noticed
STATUS_EVERY = 3  # polls between status looks when nothing else changed
LIVE_EVERY_S = 1.0  # the live state's age, sent again this often
MAX_FEEDS = 64  # live feeds open at once, over all readers

Mark = tuple[int, int | None, float | None]


def sse(event: str, data: Any) -> str:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class RunWatcher:
    """What changed in one run folder since the last look, as events."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = RunStore.open(path, read_only=True)
        self._mark: Mark | None = None
        self._status: dict[str, Any] | None = None
        self._version: int | None = None
        self._alerts: dict[str, Any] | None = None
        self._live_stamp: tuple[int, int] | None = (-1, -1)  # never looked: sent first
        self._live: dict[str, Any] | None = None
        self._live_sent = 0.0
        self._polls = 0

    def close(self) -> None:
        self.store.close()

    def poll(self) -> list[str]:
        """The events since the last call (all of them on the first)."""
        out: list[str] = []
        mark = self.store.rounds_mark()
        moved = mark != self._mark
        if moved:
            out.append(sse("rounds", self._rounds(mark)))
            out.append(sse("anomalies", anomaly_view(self.store.anomalies())))
            self._mark = mark
        self._polls += 1
        if moved or self._polls % STATUS_EVERY == 0:
            status = status_view(self.store)
            if status != self._status:
                out.append(sse("status", status))
                self._status = status
        version = self.store.data_version()
        if version != self._version:
            self._version = version
            alerts = alerts_view(self.store.alerts())
            if alerts != self._alerts:
                out.append(sse("alerts", alerts))
                self._alerts = alerts
        out.extend(self._live_event())
        return out

    def _live_event(self) -> list[str]:
        """The live state when its file changed (read again then), else its age
        every ``LIVE_EVERY_S`` while there is one."""
        stamp = self._live_file_stamp()
        now = time.time()
        if stamp != self._live_stamp:
            self._live_stamp = stamp
            self._live = read_live_state(self.path)
        elif self._live is None or now - self._live_sent < LIVE_EVERY_S:
            return []
        self._live_sent = now
        return [sse("live", live_view(self._live, now))]

    def _rounds(self, mark: Mark) -> dict[str, Any]:
        """New rows only when the rows already sent are unchanged, else all."""
        before = self._mark
        if before is not None and before[1] is not None:
            new = self.store.rounds(before[1] + 1)
            kept = self.store.rounds_mark(through=before[1])
            if kept == before and mark[0] == before[0] + len(new):
                return {"reset": False, "rows": round_rows(new)}
        return {"reset": True, "rows": round_rows(self.store.rounds())}

    def _live_file_stamp(self) -> tuple[int, int] | None:
        try:
            st = live_path(self.path).stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size


async def run_events(
    path: Path, disconnected: Callable[[], Any], poll_s: float = POLL_S
) -> AsyncIterator[str]:
    """The event stream of the run in ``path`` until the reader leaves
    (``disconnected``: an awaitable check). The store is opened, polled and
    closed in worker threads (one at a time: its read-only connection may move
    between them), so that the event loop goes on serving other requests."""
    try:
        watcher = await run_in_threadpool(RunWatcher, path)
    except StoreError as exc:
        yield sse("failure", {"error": str(exc)})
        return
    quiet = 0.0
    try:
        yield "retry: 2000\n\n"  # the browser reconnects after 2 s (a restarted dashboard)
        while not await disconnected():
            try:
                events = await run_in_threadpool(watcher.poll)
            except StoreError as exc:
                yield sse("failure", {"error": str(exc)})
                return
            for event in events:
                yield event
            quiet = 0.0 if events else quiet + poll_s
            if quiet >= KEEPALIVE_S:
                quiet = 0.0
                yield ": keep-alive\n\n"
            await asyncio.sleep(poll_s)
    finally:
        watcher.close()


class Feeds:
    """The live feeds open at once: at most ``most``."""

    def __init__(self, most: int = MAX_FEEDS) -> None:
        self.most = most
        self.open = 0  # touched on the event loop alone

    async def events(
        self, path: Path, disconnected: Callable[[], Any], poll_s: float = POLL_S
    ) -> AsyncIterator[str]:
        """:func:`run_events`, or one ``failure`` event when ``most`` feeds are
        open (the browser stops there and says why)."""
        if self.open >= self.most:
            why = f"the dashboard has {self.most} live feeds open already; reload the page later"
            yield sse("failure", {"error": why})
            return
        self.open += 1
        try:
            async for event in run_events(path, disconnected, poll_s):
                yield event
        finally:
            self.open -= 1


__all__ = ["LIVE_EVERY_S", "MAX_FEEDS", "POLL_S", "Feeds", "RunWatcher", "run_events", "sse"]

"""The deployment server's wait for its clients before round 1, said as it goes:
who has joined and which ids it still waits for, as ranges (readable at 10,000
clients), and until when ("25 of 100 joined; waiting for ids 25-99 until 10:42").

A line is logged when the wait starts, when the joined set changed (at most once
a second: a burst of joins is one line), and every ``REPORT_S`` otherwise.
"""

from __future__ import annotations

import time

from fedforge.transport.hub import Hub
from fedforge.transport.ids import logged_ids
from fedforge.transport.logs import log_event

REPORT_S = 5.0  # a line at least this often while nothing changes
BURST_S = 1.0  # ... and at most one a second while clients join


def progress_line(joined: list[int], num_clients: int, need: int, until: str) -> str:
    """The line for ``joined`` of ``num_clients`` ids, ``need`` needed to start."""
    waiting = sorted(set(range(num_clients)) - set(joined))
    needed = f" ({need} needed to start)" if need < num_clients else ""
    return (
        f"{len(joined)} of {num_clients} joined{needed}; waiting for ids "
        f"{logged_ids(waiting)} until {until}"
    )


def wait_for_joins(hub: Hub, need: int, timeout_s: float) -> int:
    """Wait until ``need`` clients joined or ``timeout_s`` passed, logging the
    progress; how many joined."""
    end = hub.clock() + timeout_s
    until = time.strftime("%H:%M", time.localtime(time.time() + timeout_s))
    said_at, said = -float("inf"), None
    while True:
        with hub.cond:
            joined = sorted(hub.members)
            now = hub.clock()
            if len(joined) >= need or now >= end:
                return len(joined)
            due = now - said_at >= REPORT_S or (joined != said and now - said_at >= BURST_S)
            if not due:
                hub.cond.wait(min(BURST_S / 4, end - now))
                continue
        line = progress_line(joined, hub.num_clients, need, until)  # logged without the lock
        log_event("server", "joining", joined=len(joined), need=need, message=line)
        said_at, said = now, joined


__all__ = ["progress_line", "wait_for_joins"]

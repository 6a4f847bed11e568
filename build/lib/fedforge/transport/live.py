"""The deployment server's live state in its run folder (``store/live_state.py``),
for the dashboard: connected clients, the round's phase, dropouts and refused
uploads by reason.

The hub tells :class:`LivePublisher` when something changed (a join, a phase,
unanswered questions; the server tells it of each refusal); a thread of its own
writes the file then, at most once per ``min_interval_s`` (a burst of refusals
is one write), and every ``refresh_s`` regardless, so that clients going silent
show and a reader can tell a live server from a killed one. Nothing is written
before the run's folder exists (the server binds it when the run's store opens).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from fedforge.report.reasons import refusal_label
from fedforge.store.live_state import write_live_state
from fedforge.transport.hub import Hub
from fedforge.transport.logs import log_event

MIN_INTERVAL_S = 0.25
REFRESH_S = 2.0


class LivePublisher:
    """Writes ``hub``'s state to the bound run folder's live-state file."""

    def __init__(
        self,
        hub: Hub,
        address: str,
        min_interval_s: float = MIN_INTERVAL_S,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self.hub, self.address = hub, address
        self.min_interval_s, self.refresh_s = min_interval_s, refresh_s
        self.writes = 0
        self._run_dir: Path | None = None
        self._refused: dict[str, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="live-state", daemon=True)
        self._failed = False

    def start(self) -> None:
        self._thread.start()

    def bind(self, run_dir: Path) -> None:
        """The run's folder, where the file goes from now on."""
        with self._lock:
            self._run_dir = Path(run_dir)
        self.changed()

    def changed(self) -> None:
        """Something changed: write soon (never blocks: the hub calls it under its lock)."""
        self._wake.set()

    def refused(self, why: str) -> None:
        """An upload or request refused, counted by its reason's label."""
        kind = refusal_label(why)
        with self._lock:
            self._refused[kind] = self._refused.get(kind, 0) + 1
        self.changed()

    def snapshot(self, serving: bool = True) -> dict[str, Any]:
        """The state as written to the file."""
        hub = self.hub
        with hub.cond:
            joined, phase = sorted(hub.members), hub.phase
            accepted, dropouts = hub.accepted, hub.dropouts
            up, down = hub.bytes_up, hub.bytes_down
        with self._lock:
            refused = dict(self._refused)
        return {
            "updated": time.time(),
            "serving": serving,
            "pid": os.getpid(),
            "address": self.address,
            "phase": phase,
            "num_clients": hub.num_clients,
            "joined": joined,
            "connected": hub.alive(),
            "accepted": accepted,
            "dropouts": dropouts,
            "refused": refused,
            "bytes_up": up,
            "bytes_down": down,
        }

    def close(self, phase: str) -> None:
        """Stop the thread and write the last state: not serving, ``phase``."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self.hub.set_phase(phase)
        self._write(serving=False)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.refresh_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            self._write(serving=True)
            self._stop.wait(self.min_interval_s)  # changes meanwhile: one write after

    def _write(self, serving: bool) -> None:
        with self._lock:
            run_dir = self._run_dir
        if run_dir is None:
            return
        try:
            write_live_state(run_dir, self.snapshot(serving))
            self.writes += 1
        except OSError as exc:  # the dashboard's view only: the run goes on
            if not self._failed:
                log_event("server", "live_state_failed", run_dir=str(run_dir), error=str(exc))
            self._failed = True


__all__ = ["LivePublisher"]

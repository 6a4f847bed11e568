"""The deployment server's record of who was there: the hub's spells
(``spells.py``) written to the run store's ``presence`` tables
(``store/presence.py``) in seconds from the run's start (negative before it:
a new run's store is made once its first clients joined).

The round thread writes (``RemoteEngine``): at each upload round's start, after
any wait for clients (so a round skipped for too few of them is on record),
and at its end. Each write is one transaction holding the rows changed since
the last one and this watch's end; nothing is written from the gRPC threads.
"""

from __future__ import annotations

import time

from fedforge.core.errors import StoreError
from fedforge.store import RunStore
from fedforge.store.presence import record_presence, run_start, stored_rows
from fedforge.transport.hub import Hub
from fedforge.transport.logs import log_event


class PresenceLog:
    """Writes ``hub``'s spells to the bound run store."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.store: RunStore | None = None
        self.shift = 0.0  # the hub's clock + shift: seconds from the run's start
        self._failed = False

    def bind(self, store: RunStore) -> None:
        """The run's store: the hub's clock is tied to the run's start, and the
        rows earlier watches wrote count toward each client's bound."""
        self.store = store
        self.shift = time.time() - run_start(store) - self.hub.clock()
        counts = stored_rows(store)
        with self.hub.cond:
            self.hub.spells.stored = counts

    def write(self) -> None:
        """Write the spells changed since the last write, and the watch so far."""
        if self.store is None:
            return
        now, began, changed = self.hub.spell_rows()

        def at(t: float) -> float:  # negative: before the run's store was made
            return t + self.shift

        rows = [(c, at(s.since), at(s.until), int(s.left), s.gaps, s.gap_s) for c, s in changed]
        try:
            record_presence(self.store, (at(began), at(now)), rows)
        except StoreError as exc:  # the availability record only: the run goes on
            if not self._failed:
                log_event("server", "presence_not_recorded", error=str(exc))
            self._failed = True


__all__ = ["PresenceLog"]

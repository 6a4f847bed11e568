"""Each client's online spells as the deployment server sees them: the stretches
of time during which the hub counted the client's process as there
(``presence.py``; what ``Hub.alive`` answers), kept as rows for the run store's
``presence`` table, from which ``fedforge profile`` derives each client's
availability (``systems/measured_availability.py``).

A spell opens when the client joins or, after it was gone, when its session
calls again; it closes when its process hangs up (at that moment) or goes
quiet past the presence rules (at the moment those stopped counting it there).
Times are the hub's clock; the writer (``presence_log.py``) turns them into
seconds from the run's start.

A client that connects and disconnects rapidly must not grow the table without
bound: a return within ``MERGE_GAP_S`` of the last spell's end, and every return
once the client has ``MAX_ROWS`` rows, extends its last row instead of opening
one, the offline gap counted in the row (``gaps``, ``gap_s``). A row therefore
stands for one or more spells, and the totals the availability is derived from
(seconds online and offline, departures and returns) stay exact; only the
timeline of a flapping client is coarser.

Nothing here locks: the hub calls it under its own lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MERGE_GAP_S = 1.0  # a return this soon after leaving extends the last row
MAX_ROWS = 200  # a client's rows in a run (one more for each server restart)


@dataclass
class Spell:
    """One row: a client there from ``since`` to ``until``, less ``gaps`` offline
    gaps of ``gap_s`` seconds in all merged into it; ``left``: its last spell
    ended with the client leaving (else it was still there at ``until``)."""

    since: float
    until: float
    left: bool = False
    gaps: int = 0
    gap_s: float = 0.0


@dataclass
class Spells:
    """Every client's rows since this server process began watching."""

    max_rows: int = MAX_ROWS
    rows: dict[int, list[Spell]] = field(default_factory=dict)
    open: dict[int, Spell] = field(default_factory=dict)  # the row of a client there now
    # rows (client, index) changed since they were last written
    dirty: set[tuple[int, int]] = field(default_factory=set)
    stored: dict[int, int] = field(default_factory=dict)  # rows earlier watches wrote
    capped: set[int] = field(default_factory=set)  # clients whose returns were merged past the cap

    def there(self, client_id: int, now: float) -> None:
        """The hub counts ``client_id`` there at ``now``."""
        row = self.open.get(client_id)
        if row is not None:
            if now > row.until:
                row.until = now
                self._touched(client_id)
            return
        rows = self.rows.setdefault(client_id, [])
        last = rows[-1] if rows else None
        room = max(1, self.max_rows - self.stored.get(client_id, 0))
        full = len(rows) >= room
        if last is not None and (full or now - last.until <= MERGE_GAP_S):
            if full:
                self.capped.add(client_id)
            gap = max(0.0, now - last.until)
            last.gaps += 1
            last.gap_s += gap
            last.until = max(last.until, now)
            last.left = False
            row = last
        else:
            row = Spell(now, now)
            rows.append(row)
        self.open[client_id] = row
        self._touched(client_id)

    def gone(self, client_id: int, at: float) -> None:
        """``client_id`` stopped being counted there at ``at``."""
        row = self.open.pop(client_id, None)
        if row is None:
            return
        row.until = max(row.until, at)
        row.left = True
        self._touched(client_id)

    def _touched(self, client_id: int) -> None:
        # the row changed is always the client's last: an open row is its last one
        self.dirty.add((client_id, len(self.rows[client_id]) - 1))

    def changed(self) -> list[tuple[int, Spell]]:
        """The rows changed since the last call (copies), by client and start."""
        out = []
        for c, i in sorted(self.dirty):
            r = self.rows[c][i]
            out.append((c, Spell(r.since, r.until, r.left, r.gaps, r.gap_s)))
        self.dirty.clear()
        return out


__all__ = ["MAX_ROWS", "MERGE_GAP_S", "Spell", "Spells"]

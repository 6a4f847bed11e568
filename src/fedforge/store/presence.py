"""A deployment's record of when each client process was there: its online
spells (``transport/spells.py``) and the stretches of time a server process
watched (``presence_watch``), in seconds from the run's start (the ``runs``
row's ``created``). ``fedforge profile`` derives each client's availability
from them (``systems/measured_availability.py``).

Not per-round tables: a resume keeps them (what was seen happened, whatever
rounds are re-run), and each server process adds its own watch. The server
writes at each upload round's start (also when the round is then skipped for
too few clients: exactly when clients are away) and end, one transaction each
time, only the rows changed since; a server killed loses at most what it saw
since its last write, and its watch ends there too, so the rows never claim
more than was seen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fedforge.core.errors import StoreError
from fedforge.store.database import DB_ERRORS
from fedforge.store.runstore import RunStore

# a row per online spell, or several merged (gaps: the offline gaps inside it, of
# gap_s seconds in all); left 1: its last spell ended with the client leaving,
# 0: the client was still there at ``until`` (the watch's last write)
PRESENCE = """CREATE TABLE IF NOT EXISTS presence (client_id INTEGER NOT NULL,
    since REAL NOT NULL, until REAL NOT NULL, left INTEGER NOT NULL,
    gaps INTEGER NOT NULL, gap_s REAL NOT NULL, PRIMARY KEY (client_id, since))"""
# each server process's watch: from its start to its last write
PRESENCE_WATCH = """CREATE TABLE IF NOT EXISTS presence_watch (since REAL PRIMARY KEY,
    until REAL NOT NULL)"""

Row = tuple[int, float, float, int, int, float]  # client, since, until, left, gaps, gap_s


def run_start(store: RunStore) -> float:
    """The run's start (Unix seconds): its ``runs.created``."""
    text = store._query("SELECT created FROM runs")[0][0]
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        raise StoreError(f"run store '{store.path}': created = {text!r:.40} is no time") from None


def record_presence(store: RunStore, watch: tuple[float, float], rows: Sequence[Row]) -> None:
    """Write this server's ``watch`` (since, until) and the spell ``rows`` changed
    since its last write (each replacing the row of its client and start)."""
    conn = store._conn
    try:
        with conn:
            conn.execute(PRESENCE)
            conn.execute(PRESENCE_WATCH)
            conn.execute("INSERT OR REPLACE INTO presence_watch VALUES (?, ?)", watch)
            conn.executemany("INSERT OR REPLACE INTO presence VALUES (?, ?, ?, ?, ?, ?)", rows)
    except DB_ERRORS as exc:
        raise StoreError(f"cannot record who was connected in '{store.path}': {exc}") from None


def stored_rows(store: RunStore) -> dict[int, int]:
    """How many spell rows each client has in the store."""
    if not store._has_table("presence"):
        return {}
    rows = store._query("SELECT client_id, COUNT(*) FROM presence GROUP BY client_id")
    return {int(c): int(n) for c, n in rows}


def read_presence(store: RunStore) -> tuple[list[Row], list[tuple[float, float]]] | None:
    """The spell rows (by client, then start) and the watches (by start); None
    when the run has no record of who was connected (a simulation, or a
    deployment of an earlier version)."""
    if not store._has_table("presence_watch"):
        return None
    rows: list[Any] = store._query("SELECT * FROM presence ORDER BY client_id, since")
    watches = store._query("SELECT since, until FROM presence_watch ORDER BY since")
    spells = [
        (int(c), float(s), float(u), int(lf), int(g), float(gs)) for c, s, u, lf, g, gs in rows
    ]
    out = [(float(s), float(u)) for s, u in watches]
    bad = [r for r in spells if not all(math.isfinite(v) for v in r)]
    if bad:
        raise StoreError(f"run store '{store.path}': presence row {bad[0]} is not finite")
    return spells, out


__all__ = [
    "PRESENCE",
    "PRESENCE_WATCH",
    "read_presence",
    "record_presence",
    "run_start",
    "stored_rows",
]

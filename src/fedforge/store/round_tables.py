"""The run store's optional per-round tables (privacy spent, the non-IID toolkit's
rows, the alerts fired), each created on its first write, and the query helper the run store's
readers share. :class:`~fedforge.store.runstore.RunStore` inherits them."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedforge.core.errors import StoreError
from fedforge.store.database import DB_ERRORS, PRIVACY, ROUND_TABLES
from fedforge.store.records import AlertRecord


class RoundTables:
    """Reading and writing the optional per-round tables of one run's database."""

    _path: Path
    _conn: sqlite3.Connection

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except DB_ERRORS as exc:
            raise StoreError(f"cannot read run store '{self._path}': {exc}") from None

    def record_privacy(
        self, round_idx: int, epsilon: float, delta: float, clip_norm: float | None
    ) -> None:
        """Record epsilon(delta) after round ``round_idx`` (inf is stored as NULL)."""
        eps = epsilon if math.isfinite(epsilon) else None
        try:
            with self._conn:
                self._conn.execute(PRIVACY)
                self._conn.execute(
                    "INSERT OR REPLACE INTO privacy VALUES (?, ?, ?, ?)",
                    (round_idx, eps, delta, clip_norm),
                )
        except DB_ERRORS as exc:
            raise StoreError(f"cannot record privacy of round {round_idx + 1}: {exc}") from None

    def privacy(self) -> list[tuple[int, float | None, float, float | None]]:
        """(round, epsilon, delta, clip norm) per recorded round."""
        if not self._query("SELECT 1 FROM sqlite_master WHERE name = 'privacy'"):
            return []
        rows = self._query("SELECT * FROM privacy ORDER BY round_idx")
        return [(int(r), e, float(d), c) for r, e, d, c in rows]

    def record_rows(self, table: str, round_idx: int, rows: Sequence[Sequence[Any]]) -> None:
        """Replace round ``round_idx``'s rows of ``table`` (one of ``ROUND_TABLES``;
        each row starts with the round index); NaN and inf are stored as NULL."""
        ddl = ROUND_TABLES[table]
        clean = [
            tuple(None if isinstance(v, float) and not math.isfinite(v) else v for v in row)
            for row in rows
        ]
        try:
            with self._conn:
                self._conn.execute(ddl)
                self._conn.execute(f"DELETE FROM {table} WHERE round_idx = ?", (round_idx,))
                if clean:
                    marks = ", ".join("?" * len(clean[0]))
                    self._conn.executemany(f"INSERT INTO {table} VALUES ({marks})", clean)
        except DB_ERRORS as exc:
            raise StoreError(f"cannot record {table} of round {round_idx + 1}: {exc}") from None

    def read_rows(self, table: str, round_idx: int | None = None) -> list[tuple[Any, ...]]:
        """The rows of ``table`` (one of ``ROUND_TABLES``), in key order; [] when absent."""
        if table not in ROUND_TABLES:
            raise StoreError(f"unknown table {table!r}; known: {', '.join(ROUND_TABLES)}")
        if not self._query("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)):
            return []
        where, args = ("", ()) if round_idx is None else (" WHERE round_idx = ?", (round_idx,))
        rows = self._query(f"SELECT * FROM {table}{where} ORDER BY 1, 2", args)
        return [tuple(r) for r in rows]

    def alerts(self) -> list[AlertRecord]:
        """The alerts fired, in round order, each round's in the order they fired."""
        if not self._query("SELECT 1 FROM sqlite_master WHERE name = 'alerts'"):
            return []
        rows = self._query("SELECT * FROM alerts ORDER BY round_idx, rowid")
        return [AlertRecord(*row) for row in rows]

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

    def rounds_mark(self, through: int | None = None) -> tuple[int, int | None, float | None]:
        """(rows, last round_idx, newest ``created``) of ``rounds`` (``through``: of
        the rows up to that round_idx): one cheap query whose answer changes when a
        round is recorded, replaced or rewound, for a reader that watches a run."""
        where, args = ("", ()) if through is None else (" WHERE round_idx <= ?", (through,))
        sql = f"SELECT COUNT(*), MAX(round_idx), MAX(created) FROM rounds{where}"
        count, last, newest = self._query(sql, args)[0]
        return int(count), last, newest

    def data_version(self) -> int:
        """A number that changes whenever another connection commits to this
        database (SQLite's ``PRAGMA data_version``): a watcher's cheapest look."""
        return int(self._query("PRAGMA data_version")[0][0])

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
        if not self._has_table("privacy"):
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
        if not self._has_table(table):
            return []
        where, args = ("", ()) if round_idx is None else (" WHERE round_idx = ?", (round_idx,))
        rows = self._query(f"SELECT * FROM {table}{where} ORDER BY 1, 2, 3", args)
        return [tuple(r) for r in rows]

    def _has_table(self, table: str) -> bool:
        return bool(self._query("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)))

    def group_rows(
        self,
    ) -> list[tuple[int, str, str, float | None, float | None, int | None, int | None]]:
        """Per-group evaluation, (round, attribute, group, accuracy, loss, examples,
        clients) in round, attribute, group order; [] when the run has no
        ``group_eval`` table."""
        if not self._has_table("group_eval"):
            return []
        rows = self._query(
            "SELECT round_idx, attribute, group_name, accuracy, loss, num_examples, clients "
            "FROM group_eval ORDER BY round_idx, attribute, group_name"
        )
        return [(int(r), str(a), str(g), acc, loss, n, k) for r, a, g, acc, loss, n, k in rows]

    def participation(self) -> dict[int, int]:
        """In how many recorded rounds each client's update was aggregated
        (``client_rounds``; clients never aggregated are absent)."""
        rows = self._query(
            "SELECT client_id, COUNT(*) FROM client_rounds GROUP BY client_id ORDER BY client_id"
        )
        return {int(c): int(n) for c, n in rows}

    def last_used_round(self, before: int) -> int | None:
        """The newest round before ``before`` whose aggregate used client updates
        (its ``client_rounds`` rows; a skipped round has none), or None."""
        row = self._query("SELECT MAX(round_idx) FROM client_rounds WHERE round_idx < ?", (before,))
        return None if row[0][0] is None else int(row[0][0])

    def update_norms(self) -> dict[int, list[float]]:
        """Each round's clients' update norms (the rows that carry one)."""
        rows = self._query(
            "SELECT round_idx, update_norm FROM client_rounds "
            "WHERE update_norm IS NOT NULL ORDER BY round_idx"
        )
        norms: dict[int, list[float]] = {}
        for r, norm in rows:
            norms.setdefault(int(r), []).append(float(norm))
        return norms

    def round_column(self, column: str) -> list[tuple[int, Any]] | None:
        """(round, value) of a column of ``rounds`` that not every store has, in
        round order; None when this store's ``rounds`` lacks the column."""
        have = {row[1] for row in self._query("PRAGMA table_info(rounds)")}
        if column not in have:
            return None
        rows = self._query(f'SELECT round_idx, "{column}" FROM rounds ORDER BY round_idx')
        return [(int(r), v) for r, v in rows]

    def round_clock(self) -> list[tuple[int, float, float, float, int, int, int]]:
        """The virtual clock's rounds (round, start_s, duration_s, end_s, online,
        asked, arrived), in round order; none without the clock."""
        if not self._has_table("round_clock"):
            return []
        return [tuple(r) for r in self._query("SELECT * FROM round_clock ORDER BY round_idx")]

    def alerts(self) -> list[AlertRecord]:
        """The alerts fired, in round order, each round's in the order they fired."""
        if not self._has_table("alerts"):
            return []
        rows = self._query("SELECT * FROM alerts ORDER BY round_idx, rowid")
        return [AlertRecord(*row) for row in rows]

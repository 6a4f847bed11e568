"""The run store: one directory per run with its config, an SQLite database and a JSONL stream.

``runs_dir/<YYYYmmdd-HHMMSS>-<name>-<6 hex>/`` holds ``config.yaml`` (the resolved
config), ``store.sqlite`` (the source of truth: WAL mode, one transaction per round)
and ``metrics.jsonl`` (one line per recorded round, for tools that tail a run). A
writer killed at any point leaves every committed round readable.

A resumed run (``fedforge resume``) re-runs the rounds after its checkpoint:
:meth:`RunStore.rewind` drops them from the database and from ``metrics.jsonl``
before they run again, and ``record_round`` replaces a round already stored. A
kill between a round's commit and its JSONL line, or a tool that read the stream
before a rewind, can still see a round twice: readers of ``metrics.jsonl`` take
the last line of each ``round_idx`` (:func:`read_metrics` does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fedforge.config import Config, from_dict
from fedforge.core.errors import ConfigError, StoreError
from fedforge.store.build_record import read_build
from fedforge.store.damage import StoreDamaged
from fedforge.store.database import (
    ANOMALIES,
    CLIENT_COLS,
    DB_ERRORS,
    DB_NAME,
    FLOAT32_COLS,
    INSERT_CLIENT,
    INSERT_ROUND,
    PRIVACY,
    ROUND_COLS,
    ROUND_TABLES,
    SCHEMA_VERSION,
    connect,
)
from fedforge.store.directory import check_run_dir, is_run_dir, make_run_dir
from fedforge.store.records import AnomalyRecord, ClientRecord, RoundRecord, RunInfo
from fedforge.store.round_tables import RoundTables
from fedforge.store.stream import METRICS_NAME, append_line, read_metrics, rewrite_before

__all__ = [
    "AnomalyRecord",
    "ClientRecord",
    "RoundRecord",
    "RunInfo",
    "RunStore",
    "StoreDamaged",
    "is_run_dir",
    "read_metrics",
]

STATUSES = ("running", "finished", "failed")


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


class RunStore(RoundTables):
    """Read and write one run directory. Use :meth:`create` or :meth:`open`."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self._path = path
        self._conn = conn

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, runs_dir: Path | str, config: Config) -> RunStore:
        """Make a new run directory under ``runs_dir`` for ``config``, atomically
        (:func:`~fedforge.store.directory.make_run_dir`), and open it for writing."""
        path = make_run_dir(runs_dir, config)
        return cls(path, connect(path / DB_NAME))

    @classmethod
    def open(cls, path: Path | str, read_only: bool = False) -> RunStore:
        """Reopen an existing run directory to resume writing it or, ``read_only``,
        to read it: a reader never writes the database (no WAL checkpoint when it
        closes). Damage is refused with :class:`StoreDamaged` before anything is
        read (:func:`~fedforge.store.directory.check_run_dir`)."""
        path = Path(path)
        check_run_dir(path, read_only)
        return cls(path, connect(path / DB_NAME, read_only=read_only))

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    @contextlib.contextmanager
    def _transaction(self, failed: str) -> Iterator[None]:
        """One write transaction around the block: committed when it ends, rolled
        back when it raises; a database error becomes ``StoreError("{failed}: ...")``."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        except DB_ERRORS as exc:
            raise StoreError(f"{failed}: {exc}") from None

    def record_round(
        self,
        round_row: RoundRecord,
        clients: Sequence[ClientRecord],
        anomalies: Sequence[AnomalyRecord] = (),
    ) -> None:
        """Write a round, its client rows and its anomalies in one transaction
        (replacing an earlier copy of the same round), then append one line to
        ``metrics.jsonl``."""
        stray: list[int | None] = [
            c.client_id for c in clients if c.round_idx != round_row.round_idx
        ]
        stray += [a.client_id for a in anomalies if a.round_idx != round_row.round_idx]
        if stray:
            raise StoreError(f"clients {stray} are not from round {round_row.round_idx + 1}")
        if round_row.created is None:
            round_row = dataclasses.replace(round_row, created=time.time())
        idx = round_row.round_idx
        with self._transaction(f"cannot record round {idx + 1} in '{self._path}'"):
            self._upgrade()
            self._conn.execute(INSERT_ROUND, dataclasses.astuple(round_row))
            self._conn.execute("DELETE FROM client_rounds WHERE round_idx = ?", (idx,))
            self._conn.executemany(INSERT_CLIENT, [dataclasses.astuple(c) for c in clients])
            self._conn.execute(ANOMALIES)
            self._conn.execute("DELETE FROM anomalies WHERE round_idx = ?", (idx,))
            self._conn.executemany(
                "INSERT INTO anomalies VALUES (?, ?, ?)",
                [dataclasses.astuple(a) for a in anomalies],
            )
        line = {**dataclasses.asdict(round_row), "clients": len(clients)}
        line = {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in line.items()
        }
        try:  # the stream is a convenience: the database above is the source of truth
            append_line(self._path / METRICS_NAME, line)
        except OSError as exc:
            raise StoreError(
                f"round {idx + 1} is stored but {METRICS_NAME} failed: {exc}"
            ) from None

    def rewind(self, next_round: int) -> None:
        """Forget rounds ``>= next_round`` (a resume re-runs them) and mark the run
        running again. ``metrics.jsonl`` is rewritten first (temp file, fsync, rename)
        with the last line of each earlier round, so it never names a round the
        database lacks; then the database changes in one transaction."""
        rewrite_before(self._path / METRICS_NAME, next_round)
        with self._transaction(f"cannot rewind '{self._path}' to before round {next_round + 1}"):
            self._conn.execute("DELETE FROM rounds WHERE round_idx >= ?", (next_round,))
            self._conn.execute("DELETE FROM client_rounds WHERE round_idx >= ?", (next_round,))
            self._conn.execute(ANOMALIES)
            self._conn.execute("DELETE FROM anomalies WHERE round_idx >= ?", (next_round,))
            self._conn.execute(PRIVACY)
            self._conn.execute("DELETE FROM privacy WHERE round_idx >= ?", (next_round,))
            for table, ddl in ROUND_TABLES.items():
                self._conn.execute(ddl)
                self._conn.execute(f"DELETE FROM {table} WHERE round_idx >= ?", (next_round,))
            self._conn.execute("UPDATE runs SET status = 'running', summary_json = NULL")

    def finish(self, summary: dict[str, Any], status: str = "finished") -> None:
        """Store the run's summary and mark it finished (or failed)."""
        if status not in STATUSES:
            raise StoreError(f"run status {status!r} is invalid; allowed: {', '.join(STATUSES)}")
        try:
            text = json.dumps(summary)
            self._conn.execute("UPDATE runs SET status = ?, summary_json = ?", (status, text))
        except (sqlite3.Error, TypeError, ValueError) as exc:
            raise StoreError(f"cannot finish run '{self._path}': {exc}") from None

    # ------------------------------------------------------------------ reading
    @property
    def path(self) -> Path:
        return self._path

    @property
    def status(self) -> str:
        return str(self._run_field("status"))

    def _run_field(self, column: str) -> Any:
        return self._query(f"SELECT {column} FROM runs")[0][0]

    def info(self) -> RunInfo:
        """The run's line in ``fedforge runs``."""
        name, created, status, config_json, summary_json = self._query(
            "SELECT name, created, status, config_json, summary_json FROM runs"
        )[0]
        if status == "failed" and _signal_stop(summary_json):
            status = "stopped"  # cleanly, by a signal, after a checkpoint: not a failure
        done, best = self._query("SELECT COUNT(*), MAX(test_accuracy) FROM rounds")[0]
        planned = self._json("config_json", config_json).get("rounds")
        if not _number_or_none(best) or not _number_or_none(planned):  # hand-damaged
            raise StoreError(f"run store '{self._path}' holds a damaged rounds table or config")
        config = self._json("config_json", config_json)
        algorithm = config.get("algorithm")
        score, engine = self.score_and_engine()
        # the directory's name, which `show` and `resume` take (a copied or renamed
        # run keeps its first id in the database)
        return RunInfo(
            self._path.name,
            name,
            self._path,
            created,
            status,
            done,
            planned,
            best,
            algorithm if isinstance(algorithm, str) else None,
            score,
            engine == "remote",
        )

    def score_and_engine(self) -> tuple[str, str | None]:
        """What the run's task scores by and the engine it ran on, from its summary,
        else ``build.json`` (a run still going); a run from before they were
        recorded: accuracy, engine unknown."""
        summary = self.summary() or {}
        build = read_build(self._path) or {}
        score = summary.get("score_name", build.get("score_name"))
        engine = summary.get("engine", build.get("engine"))
        return (
            score if isinstance(score, str) else "accuracy",
            engine if isinstance(engine, str) else None,
        )

    def config_data(self) -> dict[str, Any]:
        """The run's config as stored (plain data; :meth:`config` rebuilds it)."""
        return self._json("config_json", self._run_field("config_json"))

    def config(self) -> Config:
        """The run's config, rebuilt from the database."""
        try:
            return from_dict(json.loads(self._run_field("config_json")))
        except (ValueError, ConfigError) as exc:
            raise StoreError(
                f"run store '{self._path}' holds an unreadable config: {exc}"
            ) from None

    def summary(self) -> dict[str, Any] | None:
        text = self._run_field("summary_json")
        return None if text is None else self._json("summary_json", text)

    def _json(self, field: str, text: Any) -> dict[str, Any]:
        """A JSON object stored in the ``runs`` table, refused unless it is one."""
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            value = None
        if not isinstance(value, dict):
            raise StoreError(f"run store '{self._path}' holds an unreadable {field}")
        return value

    def _round_columns(self) -> set[str]:
        return {row[1] for row in self._query("PRAGMA table_info(rounds)")}

    def _upgrade(self) -> None:
        """Inside a write transaction: give an older store version 3's columns."""
        have = self._round_columns()
        missing = [c for c in FLOAT32_COLS if c not in have]
        for column in missing:
            self._conn.execute(f"ALTER TABLE rounds ADD COLUMN {column} INTEGER")
        if missing:
            self._conn.execute(ANOMALIES)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def rounds(self, first: int = 0) -> list[RoundRecord]:
        """The recorded rounds from round index ``first`` on, in order."""
        have = self._round_columns()
        cols = [c if c in have else f"NULL AS {c}" for c in ROUND_COLS]
        sql = f"SELECT {', '.join(cols)} FROM rounds WHERE round_idx >= ? ORDER BY round_idx"
        rows = self._query(sql, (first,))
        if not all(_number_or_none(v) for row in rows for v in row):  # SQLite takes text
            raise StoreError(f"run store '{self._path}' holds a damaged rounds table")
        # SQLite stores a NaN as NULL: the round's train loss was NaN (no client
        # reported one), and reads back as NaN, as the run that recorded it had it
        return [RoundRecord(row[0], row[1], _nan(row[2]), *row[3:]) for row in rows]

    def client_rounds(self, round_idx: int | None = None) -> list[ClientRecord]:
        sql = f"SELECT {', '.join(CLIENT_COLS)} FROM client_rounds"
        args: tuple[Any, ...] = ()
        if round_idx is not None:
            sql, args = sql + " WHERE round_idx = ?", (round_idx,)
        rows = self._query(sql + " ORDER BY round_idx, client_id", args)
        return [ClientRecord(*row) for row in rows]

    def anomalies(
        self, client_id: int | None = None, round_idx: int | None = None
    ) -> list[AnomalyRecord]:
        """Refused updates and skipped rounds (of one client when ``client_id`` is
        given, of one round when ``round_idx`` is), in round order."""
        if not self._has_table("anomalies"):
            return []  # a version-1 store never written by this version
        wanted = {"client_id": client_id, "round_idx": round_idx}
        said = {k: v for k, v in wanted.items() if v is not None}
        where = " WHERE " + " AND ".join(f"{k} = ?" for k in said) if said else ""
        sql = f"SELECT round_idx, client_id, reason FROM anomalies{where}"
        rows = self._query(sql + " ORDER BY round_idx, client_id, rowid", tuple(said.values()))
        return [AnomalyRecord(*row) for row in rows]

    def anomaly_counts(self) -> dict[int, int]:
        """How many of each client's updates were refused (clients never refused
        are absent): what makes a repeatedly anomalous client visible."""
        counts: dict[int, int] = {}
        for a in self.anomalies():
            if a.client_id is not None:
                counts[a.client_id] = counts.get(a.client_id, 0) + 1
        return counts


def _signal_stop(summary_json: str | None) -> bool:
    """True if a stored summary is that of a run a signal stopped cleanly (the
    summary says which signal; older stores say it in the error)."""
    try:
        summary = json.loads(summary_json) if summary_json else {}
    except ValueError:
        return False
    if not isinstance(summary, dict):
        return False
    error = summary.get("error")
    return bool(summary.get("stopped")) or (
        isinstance(error, str) and error.startswith("stopped by SIG")
    )


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))

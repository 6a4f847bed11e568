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

import dataclasses
import json
import math
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from fedforge.config import Config, dump, from_dict, to_dict
from fedforge.errors import ConfigError, StoreError
from fedforge.store.records import AnomalyRecord, ClientRecord, RoundRecord, RunInfo

# 2 added ``anomalies``, 3 the rounds' ``float32_up``/``float32_down``: an older
# store gains them on its first write, and reads them as NULL until then.
SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
STATUSES = ("running", "finished", "failed")
DB_NAME, CONFIG_NAME, METRICS_NAME = "store.sqlite", "config.yaml", "metrics.jsonl"
_RUN_DIR = re.compile(r"^(\d{8}-\d{6})-(.+)-([0-9a-f]{6})$")

_SCHEMA = """
CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL, created TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed')),
    config_json TEXT NOT NULL, summary_json TEXT);
CREATE TABLE rounds (round_idx INTEGER PRIMARY KEY, cohort_size INTEGER NOT NULL,
    train_loss REAL, test_accuracy REAL, test_loss REAL, bytes_up INTEGER NOT NULL,
    bytes_down INTEGER NOT NULL, paper_bytes INTEGER NOT NULL, lr REAL NOT NULL,
    seconds REAL NOT NULL, created REAL NOT NULL, float32_up INTEGER, float32_down INTEGER);
CREATE TABLE client_rounds (round_idx INTEGER NOT NULL, client_id INTEGER NOT NULL,
    num_examples INTEGER NOT NULL, train_loss REAL, update_norm REAL, bytes_up INTEGER NOT NULL,
    bytes_down INTEGER NOT NULL, PRIMARY KEY (round_idx, client_id));
"""
# Every refused update (client id and reason) and every skipped round (client_id
# NULL): a client's anomaly history. IF NOT EXISTS: version-1 stores gain it.
_ANOMALIES = """CREATE TABLE IF NOT EXISTS anomalies (round_idx INTEGER NOT NULL,
    client_id INTEGER, reason TEXT NOT NULL)"""
# Privacy spent after each round (DP runs): epsilon at delta, and the round's clip norm.
_PRIVACY = """CREATE TABLE IF NOT EXISTS privacy (round_idx INTEGER PRIMARY KEY,
    epsilon REAL, delta REAL NOT NULL, clip_norm REAL)"""
# Per-round rows of the non-IID toolkit (issue 4), each table created on its first
# write (IF NOT EXISTS: older stores gain them): per-client evaluation on held-out
# slices (of the global model, and after personalisation steps), per-class test
# accuracy, update diagnostics, per-client loss gaps.
ROUND_TABLES: dict[str, str] = {
    "client_eval": """CREATE TABLE IF NOT EXISTS client_eval (round_idx INTEGER NOT NULL,
        client_id INTEGER NOT NULL, accuracy REAL, loss REAL, num_examples INTEGER NOT NULL,
        PRIMARY KEY (round_idx, client_id))""",
    "personal_eval": """CREATE TABLE IF NOT EXISTS personal_eval (round_idx INTEGER NOT NULL,
        client_id INTEGER NOT NULL, accuracy REAL, loss REAL, num_examples INTEGER NOT NULL,
        PRIMARY KEY (round_idx, client_id))""",
    "class_accuracy": """CREATE TABLE IF NOT EXISTS class_accuracy (round_idx INTEGER NOT NULL,
        class_idx INTEGER NOT NULL, accuracy REAL, num_examples INTEGER NOT NULL,
        PRIMARY KEY (round_idx, class_idx))""",
    "diagnostics": """CREATE TABLE IF NOT EXISTS diagnostics (round_idx INTEGER PRIMARY KEY,
        clients INTEGER NOT NULL, mean_cosine REAL, norm_median REAL, norm_max REAL,
        norm_ratio REAL)""",
    "client_gaps": """CREATE TABLE IF NOT EXISTS client_gaps (round_idx INTEGER NOT NULL,
        client_id INTEGER NOT NULL, train_loss REAL, global_loss REAL, gap REAL,
        PRIMARY KEY (round_idx, client_id))""",
}


_ROUND_COLS = [f.name for f in dataclasses.fields(RoundRecord)]
_FLOAT32_COLS = ("float32_up", "float32_down")  # version 3
_CLIENT_COLS = [f.name for f in dataclasses.fields(ClientRecord)]
_INSERT_ROUND = (
    f"INSERT OR REPLACE INTO rounds ({', '.join(_ROUND_COLS)}) "
    f"VALUES ({', '.join('?' * len(_ROUND_COLS))})"
)
_INSERT_CLIENT = f"INSERT INTO client_rounds VALUES ({', '.join('?' * len(_CLIENT_COLS))})"


def _writable(db: Path) -> bool:
    """Whether this process may write the database and its folder (its WAL files)."""
    return os.access(db, os.W_OK) and os.access(db.parent, os.W_OK | os.X_OK)


def _connect_read_only(db: Path) -> sqlite3.Connection:
    """Read-only, with the WAL's committed rounds when SQLite can read it without
    writing; else immutable (the main file alone, which a clean close left whole)."""
    base = db.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{base}?mode=ro", uri=True, isolation_level=None)
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.Error:
        return sqlite3.connect(f"{base}?mode=ro&immutable=1", uri=True, isolation_level=None)


def _connect(db: Path, create: bool = False) -> sqlite3.Connection:
    """Autocommit connection (transactions are explicit); never creates a file by
    accident. A store this process may not write (a read-only copy, an archive) is
    opened read-only and immutable: it can be listed and shown, not resumed."""
    read_only = not create and db.is_file() and not _writable(db)
    try:
        if read_only:
            return _connect_read_only(db)
        uri = f"{db.resolve().as_uri()}?mode={'rwc' if create else 'rw'}"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
    except sqlite3.Error as exc:
        raise StoreError(f"run store '{db}' is corrupt or unreadable: {exc}") from None
    return conn


def _is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / DB_NAME).is_file()


class RunStore:
    """Read and write one run directory. Use :meth:`create` or :meth:`open`."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self._path = path
        self._conn = conn

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, runs_dir: Path | str, config: Config) -> RunStore:
        """Make a new run directory under ``runs_dir`` for ``config``."""
        now = datetime.now().astimezone()
        run_id = f"{now:%Y%m%d-%H%M%S}-{config.name}-{secrets.token_hex(3)}"
        path = Path(runs_dir) / run_id
        try:
            path.mkdir(parents=True, exist_ok=False)
            (path / CONFIG_NAME).write_text(dump(config))
            (path / METRICS_NAME).touch()
        except OSError as exc:
            raise StoreError(f"cannot create run directory '{path}': {exc}") from None
        conn = _connect(path / DB_NAME, create=True)
        try:
            conn.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA} {_ANOMALIES}; PRAGMA user_version = {SCHEMA_VERSION};"
            )
            conn.execute(
                "INSERT INTO runs VALUES (?, ?, ?, 'running', ?, NULL)",
                (
                    run_id,
                    config.name,
                    now.isoformat(timespec="seconds"),
                    json.dumps(to_dict(config)),
                ),
            )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot initialise run store in '{path}': {exc}") from None
        return cls(path, conn)

    @classmethod
    def open(cls, path: Path | str) -> RunStore:
        """Reopen an existing run directory (to read it, or to resume writing)."""
        path = Path(path)
        if not path.is_dir():
            raise StoreError(f"run directory '{path}' does not exist")
        if not (path / DB_NAME).is_file():
            raise StoreError(f"'{path}' is not a run directory: it has no {DB_NAME}")
        conn = _connect(path / DB_NAME)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            count = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            ok = version in READABLE_VERSIONS and count == 1
            problem = "" if ok else "unexpected content"
            problem += f" (schema version {version}, {count} run rows)" if problem else ""
            if isinstance(version, int) and version > max(READABLE_VERSIONS):
                problem = (
                    f"written by a newer fedforge (schema version {version}; this one "
                    f"reads {', '.join(map(str, READABLE_VERSIONS))})"
                )
        except sqlite3.Error as exc:
            problem = str(exc)
        if problem:
            conn.close()
            what = "unreadable" if problem.startswith("written by") else "corrupt or not a run"
            raise StoreError(f"run store '{path / DB_NAME}' is {what}: {problem}")
        return cls(path, conn)

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
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
            raise StoreError(f"clients {stray} are not from round {round_row.round_idx}")
        if round_row.created is None:
            round_row = dataclasses.replace(round_row, created=time.time())
        idx = round_row.round_idx
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._upgrade()
                self._conn.execute(_INSERT_ROUND, dataclasses.astuple(round_row))
                self._conn.execute("DELETE FROM client_rounds WHERE round_idx = ?", (idx,))
                self._conn.executemany(_INSERT_CLIENT, [dataclasses.astuple(c) for c in clients])
                self._conn.execute(_ANOMALIES)
                self._conn.execute("DELETE FROM anomalies WHERE round_idx = ?", (idx,))
                self._conn.executemany(
                    "INSERT INTO anomalies VALUES (?, ?, ?)",
                    [dataclasses.astuple(a) for a in anomalies],
                )
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StoreError(f"cannot record round {idx} in '{self._path}': {exc}") from None
        line = {**dataclasses.asdict(round_row), "clients": len(clients)}
        line = {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in line.items()
        }
        try:  # the stream is a convenience: the database above is the source of truth
            with open(self._path / METRICS_NAME, "a", encoding="utf-8") as stream:
                stream.write(json.dumps(line, separators=(",", ":")) + "\n")
                stream.flush()
                os.fsync(stream.fileno())
        except OSError as exc:
            raise StoreError(f"round {idx} is stored but {METRICS_NAME} failed: {exc}") from None

    def record_privacy(
        self, round_idx: int, epsilon: float, delta: float, clip_norm: float | None
    ) -> None:
        """Record epsilon(delta) after round ``round_idx`` (inf is stored as NULL)."""
        eps = epsilon if math.isfinite(epsilon) else None
        try:
            with self._conn:
                self._conn.execute(_PRIVACY)
                self._conn.execute(
                    "INSERT OR REPLACE INTO privacy VALUES (?, ?, ?, ?)",
                    (round_idx, eps, delta, clip_norm),
                )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot record privacy of round {round_idx}: {exc}") from None

    def privacy(self) -> list[tuple[int, float | None, float, float | None]]:
        """(round, epsilon, delta, clip norm) per recorded round."""
        if not self._query("SELECT 1 FROM sqlite_master WHERE name = 'privacy'"):
            return []
        rows = self._query("SELECT * FROM privacy ORDER BY round_idx")
        return [(int(r), e, float(d), c) for r, e, d, c in rows]

    def rewind(self, next_round: int) -> None:
        """Forget rounds ``>= next_round`` (a resume re-runs them) and mark the run
        running again. The database changes in one transaction; ``metrics.jsonl`` is
        rewritten (temp file, fsync, rename) with the last line of each earlier round."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("DELETE FROM rounds WHERE round_idx >= ?", (next_round,))
                self._conn.execute("DELETE FROM client_rounds WHERE round_idx >= ?", (next_round,))
                self._conn.execute(_ANOMALIES)
                self._conn.execute("DELETE FROM anomalies WHERE round_idx >= ?", (next_round,))
                self._conn.execute(_PRIVACY)
                self._conn.execute("DELETE FROM privacy WHERE round_idx >= ?", (next_round,))
                for table, ddl in ROUND_TABLES.items():
                    self._conn.execute(ddl)
                    self._conn.execute(f"DELETE FROM {table} WHERE round_idx >= ?", (next_round,))
                self._conn.execute("UPDATE runs SET status = 'running', summary_json = NULL")
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StoreError(f"cannot rewind '{self._path}' to round {next_round}: {exc}") from None
        stream = self._path / METRICS_NAME
        kept = [line for line in read_metrics(stream) if line["round_idx"] < next_round]
        tmp = stream.with_suffix(".jsonl.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                out.writelines(json.dumps(line, separators=(",", ":")) + "\n" for line in kept)
                out.flush()
                os.fsync(out.fileno())
            tmp.replace(stream)
        except OSError as exc:
            raise StoreError(f"cannot rewrite '{stream}': {exc}") from None

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

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read run store '{self._path}': {exc}") from None

    def info(self) -> RunInfo:
        """The run's line in ``fedforge runs``."""
        name, created, status, config_json = self._query(
            "SELECT name, created, status, config_json FROM runs"
        )[0]
        done, best = self._query("SELECT COUNT(*), MAX(test_accuracy) FROM rounds")[0]
        planned = self._json("config_json", config_json).get("rounds")
        # the directory's name, which `show` and `resume` take (a copied or renamed
        # run keeps its first id in the database)
        return RunInfo(self._path.name, name, self._path, created, status, done, planned, best)

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
        except sqlite3.Error as exc:
            raise StoreError(f"cannot record {table} of round {round_idx}: {exc}") from None

    def read_rows(self, table: str, round_idx: int | None = None) -> list[tuple[Any, ...]]:
        """The rows of ``table`` (one of ``ROUND_TABLES``), in key order; [] when absent."""
        if table not in ROUND_TABLES:
            raise StoreError(f"unknown table {table!r}; known: {', '.join(ROUND_TABLES)}")
        if not self._query("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)):
            return []
        where, args = ("", ()) if round_idx is None else (" WHERE round_idx = ?", (round_idx,))
        rows = self._query(f"SELECT * FROM {table}{where} ORDER BY 1, 2", args)
        return [tuple(r) for r in rows]

    def _round_columns(self) -> set[str]:
        return {row[1] for row in self._query("PRAGMA table_info(rounds)")}

    def _upgrade(self) -> None:
        """Inside a write transaction: give an older store version 3's columns."""
        have = self._round_columns()
        missing = [c for c in _FLOAT32_COLS if c not in have]
        for column in missing:
            self._conn.execute(f"ALTER TABLE rounds ADD COLUMN {column} INTEGER")
        if missing:
            self._conn.execute(_ANOMALIES)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def rounds(self) -> list[RoundRecord]:
        have = self._round_columns()
        cols = [c if c in have else f"NULL AS {c}" for c in _ROUND_COLS]
        rows = self._query(f"SELECT {', '.join(cols)} FROM rounds ORDER BY round_idx")
        return [RoundRecord(*row) for row in rows]

    def client_rounds(self, round_idx: int | None = None) -> list[ClientRecord]:
        sql = f"SELECT {', '.join(_CLIENT_COLS)} FROM client_rounds"
        args: tuple[Any, ...] = ()
        if round_idx is not None:
            sql, args = sql + " WHERE round_idx = ?", (round_idx,)
        rows = self._query(sql + " ORDER BY round_idx, client_id", args)
        return [ClientRecord(*row) for row in rows]

    def anomalies(self, client_id: int | None = None) -> list[AnomalyRecord]:
        """Refused updates and skipped rounds (of one client when ``client_id`` is
        given), in round order."""
        if not self._query("SELECT 1 FROM sqlite_master WHERE name = 'anomalies'"):
            return []  # a version-1 store never written by this version
        sql = "SELECT round_idx, client_id, reason FROM anomalies"
        args: tuple[Any, ...] = ()
        if client_id is not None:
            sql, args = sql + " WHERE client_id = ?", (client_id,)
        rows = self._query(sql + " ORDER BY round_idx, client_id, rowid", args)
        return [AnomalyRecord(*row) for row in rows]

    def anomaly_counts(self) -> dict[int, int]:
        """How many of each client's updates were refused (clients never refused
        are absent): what makes a repeatedly anomalous client visible."""
        counts: dict[int, int] = {}
        for a in self.anomalies():
            if a.client_id is not None:
                counts[a.client_id] = counts.get(a.client_id, 0) + 1
        return counts


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """The rounds of a ``metrics.jsonl`` stream in round order, the last line of each
    ``round_idx`` winning (a resumed run may have written a round twice). A torn
    last line (a writer killed mid-write) is skipped."""
    by_round: dict[int, dict[str, Any]] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreError(f"cannot read '{path}': {exc}") from None
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and isinstance(line.get("round_idx"), int):
            by_round[line["round_idx"]] = line
    return [by_round[k] for k in sorted(by_round)]

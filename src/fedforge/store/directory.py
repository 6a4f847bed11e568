"""One run's directory on disk: its name (``<YYYYmmdd-HHMMSS>-<name>-<6 hex>``),
its making, and the checks a directory passes before :class:`~fedforge.store.runstore.RunStore`
keeps a connection to its database.

A directory is made under a hidden temporary name and renamed into place once
its ``config.yaml``, empty ``metrics.jsonl`` and initialised database are
written, so a run listed is never half made. Opening checks the files as files
first (``damage.py``), then the schema version and the single ``runs`` row,
then the database and stream (and a finished run's final parameters) for
damage; what fails is refused in one line and left unchanged."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import sqlite3
from datetime import datetime
from pathlib import Path

from fedforge.config import Config, dump, to_dict
from fedforge.core.errors import StoreError
from fedforge.store.damage import StoreDamaged, damage, file_damage
from fedforge.store.database import (
    ANOMALIES,
    DB_ERRORS,
    DB_NAME,
    READABLE_VERSIONS,
    SCHEMA,
    SCHEMA_VERSION,
    connect,
)
from fedforge.store.disk import os_error_text
from fedforge.store.final import final_damage
from fedforge.store.stream import METRICS_NAME

CONFIG_NAME = "config.yaml"
_RUN_ID = re.compile(r"^(\d{8}-\d{6})-(.+)-([0-9a-f]{6})$")


def is_run_dir(path: Path) -> bool:
    """A run directory (a hidden one is a run still being created, or never made).
    False, too, for a path the system refuses to look at (a name too long)."""
    if path.name.startswith("."):
        return False
    try:
        return path.is_dir() and (path / DB_NAME).is_file()
    except OSError:  # ENAMETOOLONG, EACCES: not a run this process can read
        return False


def config_name(path: Path) -> str:
    """The config name in a run directory's name ('' when it is not a run id)."""
    match = _RUN_ID.match(path.name)
    return match.group(2) if match else ""


def make_run_dir(runs_dir: Path | str, config: Config) -> Path:
    """A new run directory under ``runs_dir`` for ``config``, made atomically: built
    under a hidden temporary name (which ``runs`` skips) and renamed into place
    once its config and database are written; a failure (a full disk) removes it
    and raises StoreError naming the run and why."""
    now = datetime.now().astimezone()
    run_id = f"{now:%Y%m%d-%H%M%S}-{config.name}-{secrets.token_hex(3)}"
    path = Path(runs_dir) / run_id
    tmp = path.with_name(f".tmp-{run_id}")
    try:
        tmp.mkdir(parents=True, exist_ok=False)
        (tmp / CONFIG_NAME).write_text(dump(config))
        (tmp / METRICS_NAME).touch()
        _initialise(tmp / DB_NAME, run_id, config, now)
        tmp.rename(path)
    except (OSError, StoreError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        why = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
        raise StoreError(f"cannot create run directory '{path}': {why}") from None
    return path


def _initialise(db: Path, run_id: str, config: Config, now: datetime) -> None:
    """Create the run's database: its schema and its row in ``runs``, committed
    and closed (a clean close leaves no WAL file)."""
    conn = connect(db, create=True)
    try:
        conn.executescript(
            f"BEGIN IMMEDIATE; {SCHEMA} {ANOMALIES}; PRAGMA user_version = {SCHEMA_VERSION};"
        )
        created = now.isoformat(timespec="seconds")
        conn.execute(
            "INSERT INTO runs VALUES (?, ?, ?, 'running', ?, NULL)",
            (run_id, config.name, created, json.dumps(to_dict(config))),
        )
        conn.execute("COMMIT")
    except DB_ERRORS as exc:
        raise StoreError(f"cannot initialise its database: {exc}") from None
    finally:
        conn.close()


def check_run_dir(path: Path, read_only: bool) -> None:
    """Refuse a directory that is not a run (StoreError), that a newer fedforge
    wrote, or that is damaged (:class:`StoreDamaged`), before anything reads it:
    a writer would fold a garbled WAL into the database."""
    if not path.is_dir():
        raise StoreError(f"run directory '{path}' does not exist")
    if not (path / DB_NAME).is_file():
        raise StoreError(f"'{path}' is not a run directory: it has no {DB_NAME}")
    found = file_damage(path)  # before SQLite or anything opens them
    if found:
        raise StoreDamaged(
            f"run store '{path / DB_NAME}' is damaged: {found}; it was left unchanged"
        )
    conn = connect(path / DB_NAME, read_only=True)
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
    except DB_ERRORS as exc:
        problem = str(exc)
    if problem:
        conn.close()
        what = "unreadable" if problem.startswith("written by") else "corrupt or not a run"
        raise StoreError(f"run store '{path / DB_NAME}' is {what}: {problem}")
    # a writer checks too: a stream that names rounds the database lacks is an
    # earlier fedforge's interrupted rewind, which the resume's rewind repairs
    found = damage(path, conn, rounds=read_only)
    finished = _finished_by_loop(conn) if read_only and not found else None
    if finished is not None:  # what a reader shows or reuses of a finished run
        found = final_damage(path, expected=finished)
    conn.close()
    if found:
        raise StoreDamaged(
            f"run store '{path / DB_NAME}' is damaged: {found}; it was left unchanged"
        )


def _finished_by_loop(conn: sqlite3.Connection) -> bool | None:
    """None unless the run finished; then whether the run loop finished it (its
    summary names the run's folder: it wrote final parameters first) rather than
    a caller of :meth:`RunStore.finish` that keeps none."""
    try:
        row = conn.execute("SELECT status, summary_json FROM runs").fetchone()
    except DB_ERRORS:
        return None
    if not row or row[0] != "finished":
        return None
    return isinstance(row[1], str) and '"run_dir"' in row[1]

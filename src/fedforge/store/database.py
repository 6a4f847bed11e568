"""A run's SQLite file: its schema and versions, the column lists the run store
writes, and how the file is opened (WAL, synchronous writes; read-only and, if
need be, immutable for a store this process may not write). The run store
(``runstore.py``) is the one user; it keeps the meaning of the rows."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from pathlib import Path
from typing import Any

from fedforge.core.errors import StoreError
from fedforge.store.records import ClientRecord, RoundRecord

# 2 added ``anomalies``, 3 the rounds' ``float32_up``/``float32_down``: an older
# store gains them on its first write, and reads them as NULL until then.
SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
DB_NAME = "store.sqlite"

SCHEMA = """
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
ANOMALIES = """CREATE TABLE IF NOT EXISTS anomalies (round_idx INTEGER NOT NULL,
    client_id INTEGER, reason TEXT NOT NULL)"""
# Privacy spent after each round (DP runs): epsilon at delta, and the round's clip norm.
PRIVACY = """CREATE TABLE IF NOT EXISTS privacy (round_idx INTEGER PRIMARY KEY,
    epsilon REAL, delta REAL NOT NULL, clip_norm REAL)"""
# Per-round rows of the non-IID toolkit, each table created on its first
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
    # a sparsifying uplink's uploads: how much their index sets overlap (server/index_overlap.py)
    "index_overlap": """CREATE TABLE IF NOT EXISTS index_overlap (round_idx INTEGER PRIMARY KEY,
        clients INTEGER NOT NULL, kept_mean REAL, pair_overlap REAL, chance REAL,
        union_fraction REAL, common_fraction REAL)""",
    # a deployment's new clients: the global model on each one's own data before it trains
    "cold_start": """CREATE TABLE IF NOT EXISTS cold_start (round_idx INTEGER NOT NULL,
        client_id INTEGER NOT NULL, accuracy REAL, loss REAL, num_examples INTEGER NOT NULL,
        PRIMARY KEY (round_idx, client_id))""",
    # each population group of clients (a tag's value): its clients' held-out scores
    "group_eval": """CREATE TABLE IF NOT EXISTS group_eval (round_idx INTEGER NOT NULL,
        attribute TEXT NOT NULL, group_name TEXT NOT NULL, accuracy REAL, loss REAL,
        num_examples INTEGER NOT NULL, clients INTEGER NOT NULL,
        PRIMARY KEY (round_idx, attribute, group_name))""",
    "client_gaps": """CREATE TABLE IF NOT EXISTS client_gaps (round_idx INTEGER NOT NULL,
        client_id INTEGER NOT NULL, train_loss REAL, global_loss REAL, gap REAL,
        PRIMARY KEY (round_idx, client_id))""",
    # the named metrics (config ``metrics``) of the global model on the test set
    "eval_metrics": """CREATE TABLE IF NOT EXISTS eval_metrics (round_idx INTEGER NOT NULL,
        metric TEXT NOT NULL, value REAL, PRIMARY KEY (round_idx, metric))""",
    # how long each asked client took in a round, in seconds from the round's start:
    # downloading the payload, its local work, uploading its update (the virtual
    # clock's in a simulation with system profiles, measured in a deployment);
    # arrived 0: the client dropped out (failed, went offline, or missed the deadline)
    "client_times": """CREATE TABLE IF NOT EXISTS client_times (round_idx INTEGER NOT NULL,
        client_id INTEGER NOT NULL, download_s REAL, compute_s REAL, upload_s REAL,
        total_s REAL, arrived INTEGER NOT NULL, PRIMARY KEY (round_idx, client_id))""",
    # what those seconds moved in a deployment: the training examples each asked
    # client's local work processes (epochs x its declared examples), the payload
    # it was handed and its update's bytes (NULL: none arrived); with client_times
    # the speeds and bandwidths ``fedforge profile`` derives
    "client_work": """CREATE TABLE IF NOT EXISTS client_work (round_idx INTEGER NOT NULL,
        client_id INTEGER NOT NULL, examples INTEGER, bytes_down INTEGER, bytes_up INTEGER,
        PRIMARY KEY (round_idx, client_id))""",
    # each upload round's cohort: the clients asked for it (whether or not their
    # upload arrived or was taken), drawn at round ``drawn_round`` (an upload
    # period's first round)
    "cohorts": """CREATE TABLE IF NOT EXISTS cohorts (round_idx INTEGER NOT NULL,
        client_id INTEGER NOT NULL, drawn_round INTEGER NOT NULL,
        PRIMARY KEY (round_idx, client_id))""",
    # buffered asynchronous aggregation: each server step's time on the virtual
    # clock, the updates it took and their staleness (server steps since their model)
    "buffered_rounds": """CREATE TABLE IF NOT EXISTS buffered_rounds (round_idx INTEGER
        PRIMARY KEY, virtual_time REAL, updates INTEGER NOT NULL, staleness_mean REAL,
        staleness_max INTEGER)""",
    # the virtual clock of a simulation with system profiles: each round's start,
    # duration and end (seconds of virtual time from the run's start), the clients
    # online at its start, asked, and whose uploads arrived in time
    "round_clock": """CREATE TABLE IF NOT EXISTS round_clock (round_idx INTEGER PRIMARY KEY,
        start_s REAL NOT NULL, duration_s REAL NOT NULL, end_s REAL NOT NULL,
        online INTEGER NOT NULL, asked INTEGER NOT NULL, arrived INTEGER NOT NULL)""",
    # the alerts fired after each round (fedforge.alerts): the rule, the measured value
    # against its threshold, the client it names (client_refused), what its actions did
    "alerts": """CREATE TABLE IF NOT EXISTS alerts (round_idx INTEGER NOT NULL,
        rule TEXT NOT NULL, kind TEXT NOT NULL, client_id INTEGER, value REAL,
        threshold REAL NOT NULL, message TEXT NOT NULL, outcome TEXT NOT NULL)""",
}

# The global models a deployment serves (``versions.py``), created on the first
# version's write (IF NOT EXISTS: older stores gain it). As with the per-round
# tables above, the schema version stays: an older fedforge reads the rest of the
# store and ignores the table. Not per-round: a rewind keeps the versions, whose
# models may already have been served. The partial unique index keeps at most
# one version 'promoted' (the one serving every client) and one 'canary'.
MODEL_VERSIONS = (
    """CREATE TABLE IF NOT EXISTS model_versions (version_id INTEGER PRIMARY KEY,
    parent_id INTEGER, round_idx INTEGER NOT NULL, created REAL NOT NULL,
    status TEXT NOT NULL CHECK (status IN
        ('candidate', 'canary', 'promoted', 'rolled_back', 'superseded')),
    metrics_json TEXT NOT NULL, params_file TEXT NOT NULL, params_dtype TEXT NOT NULL,
    params_shape TEXT NOT NULL, params_sha256 TEXT NOT NULL)""",
    """CREATE UNIQUE INDEX IF NOT EXISTS model_versions_live ON model_versions (status)
    WHERE status IN ('promoted', 'canary')""",
)

# What a damaged file raises: SQLite's errors, and Python's failure to decode an
# error message that quotes the damaged bytes (a UnicodeDecodeError).
DB_ERRORS = (sqlite3.Error, UnicodeDecodeError)


ROUND_COLS = [f.name for f in dataclasses.fields(RoundRecord)]
FLOAT32_COLS = ("float32_up", "float32_down")  # version 3
CLIENT_COLS = [f.name for f in dataclasses.fields(ClientRecord)]
INSERT_ROUND = (
    f"INSERT OR REPLACE INTO rounds ({', '.join(ROUND_COLS)}) "
    f"VALUES ({', '.join('?' * len(ROUND_COLS))})"
)
INSERT_CLIENT = f"INSERT INTO client_rounds VALUES ({', '.join('?' * len(CLIENT_COLS))})"


def _writable(db: Path) -> bool:
    """Whether this process may write the database and its folder (its WAL files)."""
    return os.access(db, os.W_OK) and os.access(db.parent, os.W_OK | os.X_OK)


def _connect_read_only(db: Path) -> sqlite3.Connection:
    """Read-only, with the WAL's committed rounds when SQLite can read it without
    writing the database (it may make the ``-shm`` index beside it); else immutable
    (the main file alone, which a clean close left whole). A reader may hand its
    connection from thread to thread, one at a time (the dashboard's live feed
    queries it from a worker thread each poll)."""
    base = db.resolve().as_uri()
    args: dict[str, Any] = {"uri": True, "isolation_level": None, "check_same_thread": False}
    try:
        conn = sqlite3.connect(f"{base}?mode=ro", **args)
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return conn
    except DB_ERRORS:
        return sqlite3.connect(f"{base}?mode=ro&immutable=1", **args)


def connect(db: Path, create: bool = False, read_only: bool = False) -> sqlite3.Connection:
    """Autocommit connection (transactions are explicit); never creates a file by
    accident. ``read_only`` (a reader: ``runs``, ``show``), or a store this process
    may not write (a read-only copy, an archive): opened read-only, which never
    writes the database, not even a WAL checkpoint when it closes."""
    read_only = not create and db.is_file() and (read_only or not _writable(db))
    try:
        if read_only:
            return _connect_read_only(db)
        uri = f"{db.resolve().as_uri()}?mode={'rwc' if create else 'rw'}"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
    except DB_ERRORS as exc:
        raise StoreError(f"run store '{db}' is corrupt or unreadable: {exc}") from None
    return conn

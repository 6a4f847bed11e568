"""What is checked before a run store is trusted: its WAL file frame by frame,
SQLite's ``quick_check``, and that every round ``metrics.jsonl`` names is in the
database.

SQLite reads a WAL up to its first frame that fails its checksum and ignores the
rest, so a garbled frame silently shortens a run; the next read-write close then
checkpoints the shortened state into the database for good. A frame that fails
its checksum is damage, not a torn last write, when a later frame of the same
WAL generation (same salts) verifies: SQLite only ever appends. The rounds in
``metrics.jsonl`` are a subset of the database's at all times (a round is
committed before its line is written, and a rewind rewrites the stream before
the database), so a round named there and missing from the database was lost.

While a process holds the run's lock it is writing: its WAL and stream change
under the reader, so only ``quick_check`` (a consistent snapshot) runs then."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import struct
from pathlib import Path

from fedforge.core.errors import StoreError
from fedforge.store.database import DB_ERRORS, DB_NAME
from fedforge.store.stream import METRICS_NAME, read_metrics

LOCK_NAME = "lock"  # server/state.py's RunLock
_MAGIC = (0x377F0682, 0x377F0683)  # the low bit: checksums of big-endian words
_HEADER, _FRAME_HEADER = 32, 24


class StoreDamaged(StoreError):
    """A run store whose files are damaged: reported, never read as if whole."""


def written_now(path: Path) -> bool:
    """Whether a process holds the run's lock (``server/state.py``'s RunLock; the
    kernel drops it when that process dies, however)."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock this look took
    return False


def _checksum(data: bytes, big_endian: bool, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing (s0, s1)."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    mask = 0xFFFFFFFF
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & mask
        s1 = (s1 + words[i + 1] + s0) & mask
    return s0, s1


def wal_damage(db: Path) -> str | None:
    """What is wrong with the WAL file beside ``db``, or None when it is whole (or
    absent, or its only bad frames are the torn tail of an unfinished write)."""
    wal = db.with_name(db.name + "-wal")
    try:
        data = wal.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"its WAL file {wal.name} cannot be read ({exc.strerror})"
    if len(data) < _HEADER:
        return None  # empty, or truncated after a checkpoint
    magic, version, page_size, _, salt1, salt2, c0, c1 = struct.unpack(">8I", data[:_HEADER])
    big = magic == _MAGIC[1]
    header_ok = magic in _MAGIC and version == 3007000 and page_size in _PAGE_SIZES
    if not header_ok or _checksum(data[:24], big) != (c0, c1):
        return f"its WAL file {wal.name} has a garbled header"
    frame = _FRAME_HEADER + page_size
    sums, bad = (c0, c1), None
    for k in range((len(data) - _HEADER) // frame):
        at = _HEADER + k * frame
        head = struct.unpack(">6I", data[at : at + _FRAME_HEADER])
        current = head[2:4] == (salt1, salt2)
        body = data[at : at + 8] + data[at + _FRAME_HEADER : at + frame]
        ok = current and head[0] != 0 and _checksum(body, big, *sums) == head[4:6]
        if ok and bad is not None:
            return (
                f"its WAL file {wal.name} has garbled bytes in frame {bad + 1} (from byte "
                f"{_HEADER + bad * frame}); what was committed after it cannot be read"
            )
        if not ok and bad is None:
            bad = k  # damage, a torn last write, or an earlier generation's frames
        sums = head[4:6]  # a later frame is checked from this one's stored sums
    return None


_PAGE_SIZES = tuple(2**n for n in range(9, 17))


def damage(path: Path, conn: sqlite3.Connection, rounds: bool = True) -> str | None:
    """What is wrong with the run store in ``path`` read through ``conn``, or None.
    ``rounds``: also check the database against ``metrics.jsonl``."""
    live = written_now(path)
    found = None if live else wal_damage(path / DB_NAME)
    if found:
        return found
    streamed = read_metrics(path / METRICS_NAME) if rounds and not live else []
    try:
        checks = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
        stored = {row[0] for row in conn.execute("SELECT round_idx FROM rounds").fetchall()}
    except DB_ERRORS as exc:
        return f"SQLite cannot read it ({exc})"
    if checks != ["ok"]:
        return f"SQLite's quick_check reports: {checks[0]}"
    lost = sorted(m["round_idx"] + 1 for m in streamed if m["round_idx"] not in stored)
    if lost:
        named = ", ".join(map(str, lost[:5])) + (", ..." if len(lost) > 5 else "")
        return (
            f"rounds {named} are in {METRICS_NAME} but missing from {DB_NAME} "
            f"({len(stored)} rounds stored)"
        )
    return None

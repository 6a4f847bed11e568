"""An availability trace: the intervals of virtual time in which each client
is online, read from a CSV file.

The file has the header ``client_id,start_s,end_s`` and one online interval a
line, in seconds from the run's start: 0 <= start_s < end_s, finite; a
client's intervals in increasing order, none overlapping the one before. A
client without a line is never online. The trace repeats after its last end
(its period): virtual time t is read as t modulo the period. Every error names
the file, the line and the value.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

from fedforge.core.errors import DataError, shown

TRACE_COLUMNS = ("client_id", "start_s", "end_s")


def _seconds(path: Path, line: int, column: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise DataError(
            f"{path}: line {line}: {column} = {shown(text)}; allowed: a finite number >= 0"
        )
    return value


def read_trace(
    path: str | os.PathLike[str], num_clients: int
) -> tuple[dict[int, list[tuple[float, float]]], float]:
    """Each client's online intervals by id, and the trace's period (its last end)."""
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise DataError(f"trace file {path}: cannot be read ({e.strerror or e})") from None
    spans: dict[int, list[tuple[float, float]]] = {}
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip().lower() for h in header) != TRACE_COLUMNS:
            said = "empty" if header is None else f"header {shown(','.join(header))}"
            raise DataError(f"{path}: {said}; the header is {','.join(TRACE_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != 3:
                raise DataError(f"{path}: line {line}: {len(row)} values, 3 expected")
            cid_text = row[0].strip()
            if not cid_text.isdigit() or int(cid_text) >= num_clients:
                raise DataError(
                    f"{path}: line {line}: client_id = {shown(cid_text)}; allowed: an "
                    f"integer in 0..{num_clients - 1}"
                )
            start = _seconds(path, line, "start_s", row[1])
            end = _seconds(path, line, "end_s", row[2])
            if end <= start:
                raise DataError(f"{path}: line {line}: end_s = {end:g} is not after start_s")
            mine = spans.setdefault(int(cid_text), [])
            if mine and start < mine[-1][1]:
                raise DataError(
                    f"{path}: line {line}: start_s = {start:g} is before the end of client "
                    f"{cid_text}'s previous interval ({mine[-1][1]:g}); list each client's "
                    "intervals in order, none overlapping"
                )
            mine.append((start, end))
    period = max((s[-1][1] for s in spans.values()), default=0.0)
    if period == 0.0:
        raise DataError(f"{path}: no interval; one online interval a line comes after the header")
    return spans, period


__all__ = ["TRACE_COLUMNS", "read_trace"]

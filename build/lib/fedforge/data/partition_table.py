"""A partition read from a file: a table of columns ``row, client_id`` (CSV or
Parquet) that gives each row of a training set to one client.

The header is required and names exactly the two columns, in either order
(names are matched after stripping blanks, case-insensitively); any other column
is refused. Client ids must run 0..K-1 with every client holding a row; each row
is listed at most once (every row 0..num_rows-1 exactly once when ``num_rows``
is given). Within a client, rows are sorted ascending whatever the file's order,
so two files listing the same pairs give the same partition.

CSV is read with the standard library; Parquet needs ``pyarrow`` (the
``parquet`` extra). Where it runs: on the simulation host, once, before a run.
What it trusts: nothing in the file; every error names the file, the line (CSV)
or record (Parquet) and the value.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedforge.core.errors import DataError, shown
from fedforge.data.partition import Partition

COLUMNS = ("row", "client_id")
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
_SHOW_MISSING = 5  # rows named when rows are missing
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def load_partition_table(path: str | os.PathLike[str], num_rows: int | None = None) -> Partition:
    """The partition the CSV (``.csv``) or Parquet (``.parquet``, ``.pq``) file at
    ``path`` describes; ``num_rows``: the training set's rows, each of which the
    table must then list once (None: rows are only checked to be >= 0 and unique)."""
    if num_rows is not None and (
        isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1
    ):
        raise DataError(f"num_rows = {shown(num_rows)} is invalid: must be an integer >= 1")
    file = Path(path)
    if not file.is_file():
        raise DataError(f"partition table {file}: no such file")
    suffix = file.suffix.lower()
    if suffix == ".csv":
        rows, clients, where = _read_csv(file)
    elif suffix in (".parquet", ".pq"):
        rows, clients, where = _read_parquet(file)
    else:
        raise DataError(
            f"partition table {file}: unknown format {suffix or '(no suffix)'!r}; "
            "allowed: .csv, .parquet, .pq"
        )
    return group_rows(rows, clients, num_rows, str(file), where)


def _columns(names: list[str], source: str) -> tuple[int, int]:
    """The positions of ``row`` and ``client_id`` among a header's ``names``."""
    keys = [name.strip().lower() for name in names]
    if keys and all(_INTEGER.fullmatch(k) for k in keys):
        raise DataError(
            f"{source}: the first line {','.join(names)!r} is data, not a header; "
            f"the file must start with the header {','.join(COLUMNS)}"
        )
    for key in keys:
        if keys.count(key) > 1:
            raise DataError(f"{source}: column {key!r} appears twice in the header")
    extra = [name for name, key in zip(names, keys, strict=True) if key not in COLUMNS]
    if extra:
        listed = ", ".join(repr(e) for e in extra)
        commas = "; fields are separated by commas" if len(names) == 1 and ";" in names[0] else ""
        raise DataError(
            f"{source}: column(s) {listed} not allowed; allowed columns: row, client_id{commas}"
        )
    missing = [c for c in COLUMNS if c not in keys]
    if missing:
        raise DataError(
            f"{source}: no {missing[0]!r} column (header: {','.join(names)!r}); "
            "the header must name row and client_id"
        )
    return keys.index("row"), keys.index("client_id")


def _read_csv(file: Path) -> tuple[np.ndarray, np.ndarray, Callable[[int], str]]:
    """Each record's row and client id (int64, file order) and its line number."""
    source = str(file)
    rows: list[int] = []
    clients: list[int] = []
    lines: list[int] = []
    # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
    with file.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = next((r for r in reader if r), None)  # blank lines are skipped
        if header is None:
            raise DataError(
                f"{source} is empty; expected the header row,client_id and one line per row"
            )
        at_row, at_client = _columns(header, source)
        for record in reader:
            if not record:
                continue
            line = reader.line_num
            if len(record) != len(header):
                raise DataError(
                    f"{source}, line {line}: {len(record)} field(s); the header has {len(header)}"
                )
            values = []
            for name, text in (("row", record[at_row]), ("client_id", record[at_client])):
                if not _INTEGER.fullmatch(text):
                    raise DataError(f"{source}, line {line}: {name} = {text!r} is not an integer")
                value = int(text)
                if not _INT64_MIN <= value <= _INT64_MAX:
                    raise DataError(f"{source}, line {line}: {name} = {text!r} is too large")
                values.append(value)
            rows.append(values[0])
            clients.append(values[1])
            lines.append(line)
    if not rows:
        raise DataError(f"{source} has a header but no rows")
    return (
        np.array(rows, dtype=np.int64),
        np.array(clients, dtype=np.int64),
        lambda i: f"line {lines[i]}",
    )


def _read_parquet(file: Path) -> tuple[np.ndarray, np.ndarray, Callable[[int], str]]:
    """Each record's row and client id (int64, file order); records counted from 0."""
    source = str(file)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{source}: reading Parquet needs pyarrow: pip install pyarrow") from None
    try:
        table = pq.read_table(file)
    except (OSError, pa.ArrowException) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{source} is not a readable Parquet file: {first}") from None
    names = list(table.column_names)
    if not names:
        raise DataError(f"{source} is empty; expected the columns row, client_id")
    positions = _columns(names, source)
    if table.num_rows == 0:
        raise DataError(f"{source} has the columns but no rows")
    arrays = []
    for name, at in zip(COLUMNS, positions, strict=True):
        column = table.column(at)
        if not pa.types.is_integer(column.type):
            raise DataError(f"{source}: column {name!r} is {column.type}; it must hold integers")
        if column.null_count:
            first_null = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(f"{source}, record {first_null} (0-based): {name} is null")
        values = column.to_numpy()
        if values.dtype == np.uint64 and values.size and values.max() > _INT64_MAX:
            i = int(np.argmax(values > _INT64_MAX))
            raise DataError(f"{source}, record {i} (0-based): {name} {int(values[i])} is too large")
        arrays.append(values.astype(np.int64))
    return arrays[0], arrays[1], lambda i: f"record {i} (0-based)"


def first_repeat(values: np.ndarray) -> tuple[int, int] | None:
    """``(i, j)``, ``i < j``, the first position ``j`` whose value already came at
    ``i`` (the value's first position); None when every value is distinct."""
    order = np.argsort(values, kind="stable")  # equal values keep their order
    repeats = order[1:][values[order[1:]] == values[order[:-1]]]
    if repeats.size == 0:
        return None
    j = int(repeats.min())
    return int(np.flatnonzero(values == values[j])[0]), j


def group_rows(
    rows: np.ndarray,
    clients: np.ndarray,
    num_rows: int | None,
    source: str,
    where: Callable[[int], str],
) -> Partition:
    """The partition giving ``rows[i]`` to client ``clients[i]`` (int64, same
    length), each client's rows ascending; errors start with ``source`` and
    ``where(i)``, the place of entry ``i`` (a line, a record, a row)."""
    bad = np.flatnonzero(rows < 0)
    if bad.size:
        i = int(bad[0])
        raise DataError(f"{source}, {where(i)}: row {int(rows[i])} is negative; rows are 0 or more")
    if num_rows is not None:
        bad = np.flatnonzero(rows >= num_rows)
        if bad.size:
            i = int(bad[0])
            raise DataError(
                f"{source}, {where(i)}: row {int(rows[i])} is outside 0..{num_rows - 1} "
                f"(num_rows = {num_rows})"
            )
    bad = np.flatnonzero(clients < 0)
    if bad.size:
        i = int(bad[0])
        raise DataError(
            f"{source}, {where(i)}: client id {int(clients[i])} is negative; client ids run 0..K-1"
        )
    repeat = first_repeat(rows)
    if repeat is not None:
        i, j = repeat
        raise DataError(
            f"{source}, {where(j)}: row {int(rows[j])} is listed twice "
            f"(also on {where(i)}, client {int(clients[i])}); give each row to one client"
        )
    if num_rows is not None and rows.size < num_rows:
        listed = np.zeros(num_rows, dtype=bool)
        listed[rows] = True
        missing = np.flatnonzero(~listed)
        first = ", ".join(str(int(r)) for r in missing[:_SHOW_MISSING])
        more = ", ..." if missing.size > _SHOW_MISSING else ""
        raise DataError(
            f"{source}: {missing.size} of the {num_rows} rows have no client "
            f"(first: {first}{more}); list every row 0..{num_rows - 1} once"
        )
    ids = np.unique(clients)  # ascending; ids[k] == k for every k while none is unused
    if int(ids[-1]) != ids.size - 1:  # (not a bincount: an id of 10**12 would allocate it)
        unused_id = int(np.flatnonzero(ids != np.arange(ids.size))[0])
        unused = int(ids[-1]) + 1 - ids.size
        others = f" (clients without rows: {unused})" if unused > 1 else ""
        raise DataError(
            f"{source}: client {unused_id} has no rows{others}; client ids must run "
            f"0..{int(ids[-1])} with every client holding at least one row"
        )
    sizes = np.bincount(clients, minlength=ids.size)
    order = np.lexsort((rows, clients))  # by client, then row ascending
    return Partition(tuple(np.split(rows[order], np.cumsum(sizes)[:-1])))

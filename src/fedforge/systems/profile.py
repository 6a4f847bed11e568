"""A client's system profile, and the CSV file that holds a population's.

A profile says how fast a client is and when it can be reached: its compute
speed (training examples a second), its download and upload bandwidth (bytes a
second), the latency added to each exchange, its availability (a two-state
on/off process: the mean seconds of an online and of an offline spell; no
offline spell: always online) and the chance that a round it starts fails
before its upload. The simulator's virtual clock reads them; ``fedforge
profile`` writes them from a deployment's measured times, so that a population
measured for real can be simulated.

The CSV file has a header naming exactly :data:`COLUMNS` (in any order, blanks
stripped, case-insensitive) and one row per client, ids 0..N-1 each once. An
empty ``mean_offline_s`` (or 0) means always online; ``mean_online_s`` is then
ignored. Every error names the file, the line and the value.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from fedforge.core.errors import DataError, shown


@dataclass(frozen=True)
class ClientProfile:
    """One client's system profile (seconds, bytes, examples)."""

    client_id: int
    samples_per_s: float  # local training: examples processed a second (> 0)
    download_bps: float  # bytes a second, server to client (> 0)
    upload_bps: float  # bytes a second, client to server (> 0)
    latency_s: float = 0.0  # added once to each download and each upload (>= 0)
    failure_prob: float = 0.0  # a started round fails before its upload ([0, 1])
    mean_online_s: float = math.inf  # mean online spell (> 0)
    mean_offline_s: float = 0.0  # mean offline spell (0: always online)

    @property
    def always_online(self) -> bool:
        return self.mean_offline_s == 0.0


COLUMNS = tuple(f.name for f in fields(ClientProfile))
# the values each column takes: (lowest, highest, whether the lowest is allowed)
_RANGES: dict[str, tuple[float, float, bool]] = {
    "samples_per_s": (0.0, math.inf, False),
    "download_bps": (0.0, math.inf, False),
    "upload_bps": (0.0, math.inf, False),
    "latency_s": (0.0, math.inf, True),
    "failure_prob": (0.0, 1.0, True),
    "mean_online_s": (0.0, math.inf, False),
    "mean_offline_s": (0.0, math.inf, True),
}
_ALLOWED = {
    "samples_per_s": "a finite number > 0",
    "download_bps": "a finite number > 0",
    "upload_bps": "a finite number > 0",
    "latency_s": "a finite number >= 0",
    "failure_prob": "a number in [0, 1]",
    "mean_online_s": "a number > 0 (inf: never goes offline)",
    "mean_offline_s": "a finite number >= 0 (empty or 0: always online)",
}


def _number(path: Path, line: int, column: str, text: str) -> float:
    text = text.strip()
    if column == "mean_offline_s" and text == "":
        return 0.0
    if column == "mean_online_s" and text == "":
        return math.inf
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low, high, low_ok = _RANGES[column]
    infinite_ok = column == "mean_online_s"
    bad = (
        math.isnan(value)
        or (math.isinf(value) and not infinite_ok)
        or value < low
        or (value == low and not low_ok)
        or value > high
    )
    if bad:
        raise DataError(
            f"{path}: line {line}: {column} = {shown(text)}; allowed: {_ALLOWED[column]}"
        )
    return value


def read_profiles(
    path: str | os.PathLike[str], num_clients: int | None = None
) -> list[ClientProfile]:
    """The profiles in the CSV file at ``path``, by client id; ``num_clients``: the
    run's population, which the file must cover exactly (None: any size)."""
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise DataError(f"profile file {path}: cannot be read ({e.strerror or e})") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty; a header naming {', '.join(COLUMNS)} comes first")
        names = [h.strip().lower() for h in header]
        if sorted(names) != sorted(COLUMNS):
            raise DataError(
                f"{path}: header {shown(','.join(header))}; the columns are exactly "
                f"{', '.join(COLUMNS)} (any order)"
            )
        at = {name: i for i, name in enumerate(names)}
        found: dict[int, ClientProfile] = {}
        for line, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(COLUMNS):
                raise DataError(f"{path}: line {line}: {len(row)} values, {len(COLUMNS)} expected")
            cid_text = row[at["client_id"]].strip()
            if not cid_text.isdigit():
                raise DataError(
                    f"{path}: line {line}: client_id = {shown(cid_text)}; allowed: an integer >= 0"
                )
            cid = int(cid_text)
            if cid in found:
                raise DataError(f"{path}: line {line}: client_id {cid} listed twice")
            values = {c: _number(path, line, c, row[at[c]]) for c in COLUMNS[1:]}
            found[cid] = ClientProfile(cid, **values)
    n = len(found) if num_clients is None else num_clients
    missing = [c for c in range(n) if c not in found]
    extra = sorted(c for c in found if c >= n)
    if missing or extra:
        what = f"clients {missing[:5]} missing" if missing else f"client ids {extra[:5]} beyond"
        raise DataError(f"{path}: {what}; the file lists each client 0..{n - 1} once")
    return [found[c] for c in range(n)]


def write_profiles(path: str | os.PathLike[str], profiles: list[ClientProfile]) -> None:
    """Write ``profiles`` as the CSV :func:`read_profiles` reads (written to a
    temporary file and renamed: a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for p in sorted(profiles, key=lambda p: p.client_id):
            writer.writerow([repr(v) if isinstance(v, float) else v for v in astuple(p)])
    os.replace(tmp, path)


__all__ = ["COLUMNS", "ClientProfile", "read_profiles", "write_profiles"]

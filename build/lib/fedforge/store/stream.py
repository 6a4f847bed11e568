"""``metrics.jsonl``: one JSON line per recorded round, for tools that tail a run.
The database is the source of truth; a round's line is written after the round
is committed, and a rewind rewrites the stream before it changes the database,
so every round the stream names is in the database (``damage.py`` checks it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedforge.core.errors import StoreError

METRICS_NAME = "metrics.jsonl"


def append_line(stream: Path, line: dict[str, Any]) -> None:
    """Append one round's line and fsync it (raises OSError)."""
    with open(stream, "a", encoding="utf-8") as out:
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
        out.flush()
        os.fsync(out.fileno())


def rewrite_before(stream: Path, next_round: int) -> None:
    """Keep the last line of each round before ``next_round`` (temp file, fsync, rename)."""
    kept = [line for line in read_metrics(stream) if line["round_idx"] < next_round]
    tmp = stream.with_suffix(".jsonl.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(line, separators=(",", ":")) + "\n" for line in kept)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(stream)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot rewrite '{stream}': {exc}") from None


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """The rounds of a ``metrics.jsonl`` stream in round order, the last line of each
    ``round_idx`` winning (a resumed run may have written a round twice). A torn
    last line (a writer killed mid-write) is skipped."""
    by_round: dict[int, dict[str, Any]] = {}
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
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

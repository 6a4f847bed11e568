"""What the dashboard shows, as JSON-able values read from the run folders: the
runs list (the lines of ``fedforge runs``), a run's rounds as columns for its
curves, its refused updates grouped by reason, and a deployment server's live
state. Read-only: stores are opened read-only, the live state is a file."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from fedforge.core.errors import StoreError
from fedforge.report.runs import RUN_COLUMNS, format_run_summary, run_row
from fedforge.store.live_state import STALE_AFTER_S, read_live_state
from fedforge.store.records import AnomalyRecord, RoundRecord, RunInfo
from fedforge.store.runs_dir import list_runs, live_status
from fedforge.store.runstore import RunStore, _is_run_dir

# the columns of a run's curves, from the store's ``rounds`` rows
ROUND_FIELDS = ("round", "train_loss", "test_accuracy", "test_loss", "bytes_up", "bytes_down")


def _finite(value: float | int | None) -> float | int | None:
    """JSON has no NaN or infinity: those are null (a gap in a curve)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run_entry(info: RunInfo) -> dict[str, Any]:
    """One run of the list: the texts ``fedforge runs`` prints, and the numbers."""
    texts = dict(zip(("run_id", "status", "rounds", "best", "created"), run_row(info), strict=True))
    return {
        **texts,
        "name": info.name,
        "rounds_done": info.rounds_done,
        "rounds_planned": info.rounds_planned,
        "best_accuracy": _finite(info.best_accuracy),
    }


def runs_listing(runs_dir: Path) -> dict[str, Any]:
    """Every run under ``runs_dir``, newest first."""
    runs = [run_entry(r) for r in reversed(list_runs(runs_dir))]
    return {"runs_dir": str(runs_dir), "columns": list(RUN_COLUMNS), "runs": runs}


def find_run(runs_dir: Path, run_id: str) -> Path | None:
    """The run folder named ``run_id`` directly under ``runs_dir``; None for any
    other name (a path, ``..``, a folder that is not a run)."""
    if not run_id or run_id != Path(run_id).name or run_id in (".", ".."):
        return None
    path = runs_dir / run_id
    return path if _is_run_dir(path) else None


def round_rows(records: list[RoundRecord]) -> list[dict[str, Any]]:
    """The rounds as rows of :data:`ROUND_FIELDS` (round counted from 1)."""
    return [
        {
            "round": r.round_idx + 1,
            "train_loss": _finite(r.train_loss),
            "test_accuracy": _finite(r.test_accuracy),
            "test_loss": _finite(r.test_loss),
            "bytes_up": r.bytes_up,
            "bytes_down": r.bytes_down,
        }
        for r in records
    ]


def reason_group(reason: str) -> str:
    """A refusal's reason with its numbers as N: the refusals of one cause, whatever
    client, round or value they name, fall into one group."""
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", reason)


def anomaly_view(anomalies: list[AnomalyRecord]) -> dict[str, Any]:
    """Refused updates (by reason group, most frequent first) and skipped rounds."""
    refused = [a for a in anomalies if a.client_id is not None]
    groups = Counter(reason_group(a.reason) for a in refused)
    return {
        "refused": len(refused),
        "clients": len({a.client_id for a in refused}),
        "skipped_rounds": sum(a.client_id is None for a in anomalies),
        "by_reason": [{"reason": k, "count": n} for k, n in groups.most_common()],
    }


def status_view(store: RunStore) -> dict[str, Any]:
    """The run's status as ``fedforge runs`` shows it, and its round count."""
    info = store.info()
    return {
        "status": live_status(store.path, info.status),
        "rounds_done": info.rounds_done,
        "rounds_planned": info.rounds_planned,
        "best": run_row(info)[3],
    }


def live_view(run_dir: Path) -> dict[str, Any] | None:
    """The deployment server's published state, or None (no server ran this run)."""
    state = read_live_state(run_dir)
    if state is not None:
        state["stale_after_s"] = STALE_AFTER_S
    return state


def run_detail(path: Path) -> dict[str, Any]:
    """Everything the run page shows, at once (its JSON endpoint)."""
    with RunStore.open(path, read_only=True) as store:
        rounds = store.rounds()
        try:
            summary = format_run_summary(store)
        except (StoreError, ValueError) as exc:  # a config this fedforge cannot rebuild
            summary = f"(no summary: {exc})"
        detail = {
            "run_id": path.name,
            **status_view(store),
            "summary": summary,
            "rounds": round_rows(rounds),
            "anomalies": anomaly_view(store.anomalies()),
        }
    return {**detail, "live": live_view(path)}


__all__ = [
    "ROUND_FIELDS",
    "anomaly_view",
    "find_run",
    "live_view",
    "reason_group",
    "round_rows",
    "run_detail",
    "run_entry",
    "runs_listing",
    "status_view",
]

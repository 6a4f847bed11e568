"""What the dashboard shows, as JSON-able values read from the run folders: the
runs list (the lines of ``fedforge runs``), a run's rounds as columns for its
curves, its refused updates grouped by reason, the alerts it fired, and a
deployment server's live state, judged here (live, not heard from, stopped) by
this machine's clock: the page only shows the verdict. Read-only: stores are
opened read-only, the live state is a file."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from fedforge.core.errors import StoreError
from fedforge.core.ids import format_runs, id_runs, missing_runs, run_count
from fedforge.report.html.gather import finite
from fedforge.report.progress import named_score
from fedforge.report.reasons import reason_kind, top_kinds
from fedforge.report.runs import RUN_COLUMNS, format_run_summary, run_row
from fedforge.store.directory import is_run_dir
from fedforge.store.live_state import STALE_AFTER_S, read_live_state
from fedforge.store.records import AlertRecord, AnomalyRecord, RoundRecord, RunInfo
from fedforge.store.runs_dir import list_runs, live_status
from fedforge.store.runstore import RunStore

# the columns of a run's curves, from the store's ``rounds`` rows
ROUND_FIELDS = ("round", "train_loss", "test_accuracy", "test_loss", "bytes_up", "bytes_down")
# the newest alerts the run page lists (the total is shown beside them)
ALERTS_SHOWN = 50
# the id ranges a line of client ids names; the rest are counted
SHOWN_RANGES = 12


def run_entry(info: RunInfo) -> dict[str, Any]:
    """One run of the list: the texts ``fedforge runs`` prints, and the numbers."""
    keys = ("run_id", "status", "algorithm", "mode", "rounds", "best", "created")
    texts = dict(zip(keys, run_row(info), strict=True))
    return {
        **texts,
        "name": info.name,
        "rounds_done": info.rounds_done,
        "rounds_planned": info.rounds_planned,
        "best_accuracy": finite(info.best_accuracy),
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
    return path if is_run_dir(path) else None


def round_rows(records: list[RoundRecord]) -> list[dict[str, Any]]:
    """The rounds as rows of :data:`ROUND_FIELDS` (round counted from 1)."""
    return [
        {
            "round": r.round_idx + 1,
            "train_loss": finite(r.train_loss),
            "test_accuracy": finite(r.test_accuracy),
            "test_loss": finite(r.test_loss),
            "bytes_up": r.bytes_up,
            "bytes_down": r.bytes_down,
        }
        for r in records
    ]


def anomaly_view(anomalies: list[AnomalyRecord]) -> dict[str, Any]:
    """Refused updates (by :func:`reason_kind`, the most frequent first, then a
    count of the other kinds as the report shows them) and skipped rounds."""
    refused = [a for a in anomalies if a.client_id is not None]
    groups = Counter(reason_kind(a.reason) for a in refused)
    return {
        "refused": len(refused),
        "clients": len({a.client_id for a in refused}),
        "skipped_rounds": sum(a.client_id is None for a in anomalies),
        "by_reason": [{"reason": k, "count": n} for k, n in top_kinds(groups)],
    }


def status_view(store: RunStore) -> dict[str, Any]:
    """The run's status as ``fedforge runs`` shows it, and its round count."""
    info = store.info()
    return {
        "status": live_status(store.path, info.status),
        "rounds_done": info.rounds_done,
        "rounds_planned": info.rounds_planned,
        "best": named_score(info.best_accuracy, info.score_name),
    }


def alerts_view(alerts: list[AlertRecord]) -> dict[str, Any]:
    """The alerts fired: how many, and the newest :data:`ALERTS_SHOWN` (round
    counted from 1, the rule, its message, what its actions did), oldest first."""
    shown = [
        {"round": a.round_idx + 1, "rule": a.rule, "message": a.message, "outcome": a.outcome}
        for a in alerts[-ALERTS_SHOWN:]
    ]
    return {"total": len(alerts), "rows": shown}


def _age(updated: Any, now: float) -> float | None:
    """Seconds from ``updated`` (a unix time) to ``now``, 0 for a time ahead of
    ``now``; None when ``updated`` is no number."""
    if not isinstance(updated, int | float) or isinstance(updated, bool):
        return None
    try:
        return max(0.0, now - float(updated))
    except OverflowError:  # an integer past a float
        return None


def live_view(state: dict[str, Any] | None, now: float | None = None) -> dict[str, Any] | None:
    """A deployment server's published state (None: no server ran this run) with
    its ``age_s`` (seconds since the server wrote it, by this machine's clock at
    ``now``) and its ``condition``: ``stopped`` (the server said so), ``live``
    (written within ``STALE_AFTER_S``), else ``not heard from`` (a killed server)."""
    if state is None:
        return None
    age = _age(state.get("updated"), time.time() if now is None else now)
    if not state.get("serving"):
        condition = "stopped"
    elif age is not None and age < STALE_AFTER_S:
        condition = "live"
    else:
        condition = "not heard from"
    rounded = None if age is None else round(age, 1)
    return {
        **state,
        **client_counts(state),
        "age_s": rounded,
        "condition": condition,
        "stale_after_s": STALE_AFTER_S,
    }


def _ranges(runs: list[tuple[int, int]]) -> str:
    """Runs of client ids as a person reads them at any count: ``0-24, 30, 50-99``,
    the first ``SHOWN_RANGES`` ranges and then how many more; ``-``: none."""
    return format_runs(runs, most=SHOWN_RANGES, sep=", ") or "-"


def _ids(value: Any) -> list[int]:
    """A list of client ids from the state file (anything else: none)."""
    if not isinstance(value, list):
        return []
    return [i for i in value if isinstance(i, int) and not isinstance(i, bool)]


def client_counts(state: dict[str, Any]) -> dict[str, str]:
    """The connected and joined clients, and the federation's clients not
    connected, as counts and id ranges (``75 of 100: 0-24, 50-99``): a line each
    however many clients there are."""
    total = state.get("num_clients")
    total = total if isinstance(total, int) and not isinstance(total, bool) else None
    connected, joined = _ids(state.get("connected")), _ids(state.get("joined"))
    of = "?" if total is None else f"{total:,}"
    on, ever = id_runs(connected), id_runs(joined)  # each id list sorted once
    texts = {
        "connected_text": f"{run_count(on):,} of {of}: {_ranges(on)}",
        "joined_text": f"{run_count(ever):,} of {of}: {_ranges(ever)}",
    }
    if total is not None:  # from the connected ids' runs: no set of every client
        away = missing_runs(total, on)
        texts["away_text"] = f"{run_count(away):,}: {_ranges(away)}"
    return texts


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
            "alerts": alerts_view(store.alerts()),
        }
    return {**detail, "live": live_view(read_live_state(path))}


__all__ = [
    "ALERTS_SHOWN",
    "ROUND_FIELDS",
    "alerts_view",
    "anomaly_view",
    "find_run",
    "live_view",
    "round_rows",
    "run_detail",
    "run_entry",
    "runs_listing",
    "status_view",
]

"""What ``fedforge models`` does with a run's model versions (``store/versions.py``):
``list`` prints them as a table, marking the serving one; ``promote`` and
``rollback`` change which version serves, and say what changed in one line.
A run without versions is told how to get them; a change to a finished run,
whose server has dismissed its clients, says that no client will hear of it.
A refusal (an unknown version, a rolled-back one, nothing to roll back to)
is a StoreError, which the command prints as one line with exit status 2."""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from fedforge.store.runs_dir import resolve_run
from fedforge.store.runstore import RunStore
from fedforge.store.versions import ModelVersion, list_versions, promote, rollback, serving

SERVING_MARK = "*"


def _metrics_text(metrics: dict[str, float]) -> str:
    return " ".join(f"{name}={value:.4g}" for name, value in sorted(metrics.items())) or "-"


def _created_text(created: float) -> str:
    return datetime.fromtimestamp(created).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def format_versions_table(versions: list[ModelVersion]) -> str:
    """The table of ``fedforge models list``: one line per version, oldest first,
    rounds counted from 1; the serving (promoted) version marked with ``*``."""
    if not versions:
        return "no model versions"
    rows = [("", "VERSION", "PARENT", "ROUND", "STATUS", "CREATED", "METRICS")]
    for v in versions:
        rows.append(
            (
                SERVING_MARK if v.status == "promoted" else "",
                str(v.version_id),
                "-" if v.parent_id is None else str(v.parent_id),
                str(v.round_idx + 1),
                v.status,
                _created_text(v.created),
                _metrics_text(v.metrics),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    if any(v.status == "promoted" for v in versions):
        lines.append(f"{SERVING_MARK} serving every client outside the canary")
    return "\n".join(line.rstrip() for line in lines)


def _open(args: argparse.Namespace, read_only: bool) -> RunStore:
    return RunStore.open(resolve_run(Path(args.runs_dir), args.run), read_only=read_only)


NO_VERSIONS = (
    "no model versions: a `fedforge server` run records one every "
    "deployment.canary_every rounds (0, the default, records none), "
    "e.g. --set deployment.canary_every=5"
)
UNHEARD = "; the run has finished: its clients were dismissed, and none will hear of it"


def _list(args: argparse.Namespace) -> str:
    with _open(args, read_only=True) as store:
        versions = list_versions(store)
    return format_versions_table(versions) if versions else NO_VERSIONS


def _unheard(store: RunStore) -> str:
    """What a change to the serving version reaches: nothing, once the run has
    finished (its clients were dismissed)."""
    return UNHEARD if store.status == "finished" else ""


def _promote(args: argparse.Namespace) -> str:
    with _open(args, read_only=False) as store:
        before = serving(store)
        version = promote(store, args.version_id)
        unheard = _unheard(store)
    if before is not None and before.version_id == version.version_id:
        return f"version {version.version_id} already serves every client; nothing changed"
    was = "" if before is None else f"; version {before.version_id} superseded"
    return f"version {version.version_id} promoted: it serves every client{was}{unheard}"


def _rollback(args: argparse.Namespace) -> str:
    with _open(args, read_only=False) as store:
        rolled, now = rollback(store, args.version_id)
        unheard = _unheard(store)
    return (
        f"version {rolled.version_id} rolled back; version {now.version_id} serves every "
        f"client{unheard}"
    )


def run_models_command(args: argparse.Namespace) -> int:
    """``fedforge models list|promote|rollback``: print the result; 0 when done."""
    actions = {"list": _list, "promote": _promote, "rollback": _rollback}
    print(actions[args.models_command](args))
    return 0

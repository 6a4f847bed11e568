"""Store: the SQLite run store (checkpoints come later)."""

from fedforge.store.runstore import (
    ClientRecord,
    RoundRecord,
    RunInfo,
    RunStore,
    format_run_summary,
    format_run_table,
    list_runs,
    resolve_run,
)

__all__ = [
    "ClientRecord",
    "RoundRecord",
    "RunInfo",
    "RunStore",
    "format_run_summary",
    "format_run_table",
    "list_runs",
    "resolve_run",
]

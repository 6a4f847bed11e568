"""Store: the SQLite run store, checkpoints, per-client state."""

from fedforge.store.checkpoint import (
    Checkpoint,
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)
from fedforge.store.client_state import (
    ClientStateStore,
    MemmapStateStore,
    MemoryStateStore,
    make_state_store,
    working_dir,
)
from fedforge.store.records import AlertRecord
from fedforge.store.runs_dir import list_runs, resolve_run
from fedforge.store.runstore import (
    AnomalyRecord,
    ClientRecord,
    RoundRecord,
    RunInfo,
    RunStore,
    read_metrics,
)

__all__ = [
    "AlertRecord",
    "AnomalyRecord",
    "Checkpoint",
    "CheckpointError",
    "ClientRecord",
    "ClientStateStore",
    "MemmapStateStore",
    "MemoryStateStore",
    "RoundRecord",
    "RunInfo",
    "RunStore",
    "list_checkpoints",
    "list_runs",
    "load_checkpoint",
    "load_latest",
    "make_state_store",
    "read_metrics",
    "resolve_run",
    "save_checkpoint",
    "working_dir",
]

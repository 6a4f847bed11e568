"""The rows of the run store, as frozen records."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RoundRecord:
    """One row of ``rounds``; ``created`` (unix time) is set when recorded. A NaN
    train loss reads back as NaN, a test loss or accuracy not evaluated as None.
    ``paper_bytes`` is McMahan et al.'s estimate, 2 |w| K 4, for every sampled
    client; ``float32_up`` and
    ``float32_down`` are what the messages that really travelled each way would
    cost as dense float32 (None in stores written before they existed)."""

    round_idx: int
    cohort_size: int
    train_loss: float
    test_accuracy: float | None
    test_loss: float | None
    bytes_up: int
    bytes_down: int
    paper_bytes: int
    lr: float
    seconds: float
    created: float | None = None
    float32_up: int | None = None
    float32_down: int | None = None


@dataclass(frozen=True)
class ClientRecord:
    """One row of ``client_rounds``: what one client did in one round."""

    round_idx: int
    client_id: int
    num_examples: int
    train_loss: float
    update_norm: float
    bytes_up: int
    bytes_down: int


@dataclass(frozen=True)
class AnomalyRecord:
    """One row of ``anomalies``: an update refused (client id and why) or, with
    ``client_id`` None, a round skipped (why)."""

    round_idx: int
    client_id: int | None
    reason: str


@dataclass(frozen=True)
class AlertRecord:
    """One row of ``alerts``: a rule that fired after round ``round_idx``, the value
    it measured against its threshold, the client it names (or None), and what its
    actions did (``outcome``)."""

    round_idx: int
    rule: str
    kind: str
    client_id: int | None
    value: float | None
    threshold: float
    message: str
    outcome: str


@dataclass(frozen=True)
class RunInfo:
    """One line of ``fedforge runs``."""

    run_id: str  # the directory name
    name: str  # the config name
    path: Path
    created: str
    status: str  # 'running', 'finished', 'failed', 'stopped' (by a signal: after the
    # round and a checkpoint, or at once by a second one; stored as 'failed'), 'died'
    # (running, no writer), 'unreadable'
    rounds_done: int
    rounds_planned: int | None
    best_accuracy: float | None  # the best of the task's score (``score_name``)
    algorithm: str | None = None  # the config's
    score_name: str = "accuracy"  # what the task scores by: accuracy, R^2, ...
    deployment: bool = False  # run by `fedforge server` (else the simulator)

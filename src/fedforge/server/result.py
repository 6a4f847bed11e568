"""What a run hands back to Python callers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedforge.store import RoundRecord


@dataclass
class RunResult:
    """What a finished (or signal-stopped) run hands back to Python callers."""

    params: torch.Tensor
    rounds: list[RoundRecord]
    summary: dict[str, Any]
    run_dir: Path | None = None
    rejected: list[tuple[int, int, str]] = field(default_factory=list)  # round, client, why
    skipped: list[tuple[int, str]] = field(default_factory=list)  # round, why
    stopped: str | None = None  # the signal that stopped the run early (e.g. 'SIGTERM')
    # a signal that came during the round that ended the run anyway (its last, or
    # the one reaching the target): the run is finished, a sweep stops after it
    signalled: str | None = None

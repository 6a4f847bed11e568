"""A run's numbers for other tools: ``fedforge export RUN --tensorboard DIR`` writes
TensorBoard event files, ``--mlflow TRACKING_URI`` an MLflow run (export_mlflow.py).

:func:`gather` reads what both get from the run store: per round (the step is
the round number, counted from 1), the test accuracy and loss of evaluated
rounds, the training loss, bytes up and down, seconds, the local learning rate,
epsilon spent (DP runs), the update diagnostics (mean cosine, update norms; the
uploads' index overlap under a sparsifying uplink) when recorded; the config
flattened to dotted names (hyper-parameters), its alert rules' URLs and
commands cut (report/shown_config.py; as stored when this fedforge cannot
rebuild it); the summary, whose numbers are also metrics ``summary/<name>`` at
the last round. A value that is not a finite number (a NaN training loss under
secure aggregation) is left out, as TensorBoard and MLflow could not plot it.
The libraries are imported only here, with an error naming the extra that
installs them.

TensorBoard stores scalars as float32: a value such as a byte count past 2^24
reads back rounded; MLflow keeps float64.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedforge.core.errors import FedforgeError
from fedforge.report.shown_config import shown_config
from fedforge.store.runstore import RunStore

# metric name: the rounds table's column
ROUND_METRICS = {
    "test/accuracy": "test_accuracy",
    "test/loss": "test_loss",
    "train/loss": "train_loss",
    "bytes/up": "bytes_up",
    "bytes/down": "bytes_down",
    "round/seconds": "seconds",
    "round/lr": "lr",
}
DIAGNOSTICS = ("mean_cosine", "norm_median", "norm_max", "norm_ratio")  # after round, clients
# the index_overlap table's figures (server/index_overlap.py), after round, clients
OVERLAP = ("kept_mean", "pair_overlap", "chance", "union_fraction", "common_fraction")
EPSILON = "privacy/epsilon"
SUMMARY = "summary/"

Point = tuple[int, float, float]  # step (round number), value, wall time (unix seconds)
Param = bool | int | float | str


class ExportError(FedforgeError):
    """An export that cannot be made: a missing extra, a refusing tracking server,
    a destination that already holds the run."""


def needs_extra(extra: str, what: str, exc: ImportError) -> ExportError:
    """The error for an export library that is not installed: the extra that installs it."""
    return ExportError(
        f"exporting to {what} needs the '{extra}' extra: pip install 'fedforge[{extra}]' ({exc})"
    )


@dataclass(frozen=True)
class RunExport:
    """What an export writes, read from one run store."""

    name: str  # the run directory's name
    path: Path
    status: str
    series: dict[str, list[Point]]  # metric: its points in round order
    params: dict[str, Param]  # the config, flattened to dotted names
    config_yaml: str
    summary: dict[str, Any]  # empty while the run has none (running, or killed)
    config_note: str | None = None  # why the config is exported as stored

    @property
    def last_step(self) -> int:
        return max((p[0] for points in self.series.values() for p in points), default=0)

    def summary_numbers(self) -> dict[str, float]:
        """The summary's finite numbers by dotted name (``privacy.epsilon``)."""
        flat = flatten(self.summary)
        return {
            k: float(v)
            for k, v in flat.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings to one level of dotted names; other values kept as they are."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _param(value: Any) -> Param:
    """A config value as a hyper-parameter: numbers, text and booleans as they
    are; null and lists as their JSON text."""
    if isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value)


def gather(store: RunStore) -> RunExport:
    """The run's per-round series, config and summary (see the module docstring)."""
    series: dict[str, list[Point]] = {}
    walls: dict[int, float] = {}

    def add(name: str, round_idx: int, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            wall = walls.get(round_idx, 0.0)
            series.setdefault(name, []).append((round_idx + 1, float(value), wall))

    for r in store.rounds():
        walls[r.round_idx] = r.created or 0.0
        for name, column in ROUND_METRICS.items():
            add(name, r.round_idx, getattr(r, column))
    for round_idx, epsilon, _, _ in store.privacy():
        add(EPSILON, round_idx, math.inf if epsilon is None else epsilon)
    for row in store.read_rows("diagnostics"):
        for name, value in zip(DIAGNOSTICS, row[2:], strict=True):
            add(f"diagnostics/{name}", int(row[0]), value)
    for row in store.read_rows("index_overlap"):  # a sparsifying uplink's uploads
        for name, value in zip(OVERLAP, row[2:], strict=True):
            add(f"diagnostics/{name}", int(row[0]), value)
    config = shown_config(store)
    return RunExport(
        name=store.path.name,
        path=store.path,
        status=store.info().status,  # 'stopped': a signal's clean stop
        series=series,
        params={k: _param(v) for k, v in flatten(config.data).items()},
        config_yaml=config.yaml,
        summary=store.summary() or {},
        config_note=config.note,
    )


def to_tensorboard(run: RunExport, logdir: Path) -> Path:
    """Write ``run`` as event files in ``logdir/<run name>`` (a folder per run, as
    TensorBoard lists runs): every series as scalars, the config as HParams, the
    summary's numbers as scalars and the summary and config as text. Refuses a
    folder that already holds event files (a second export would double them)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams
    except ImportError as exc:
        raise needs_extra("tensorboard", "TensorBoard", exc) from None
    folder = logdir / run.name
    if folder.is_dir() and any(folder.glob("events.out.tfevents.*")):
        raise ExportError(
            f"'{folder}' already holds TensorBoard event files: remove it to export "
            f"run {run.name} again"
        )
    try:
        writer = SummaryWriter(log_dir=str(folder))
    except OSError as exc:
        raise ExportError(f"cannot write TensorBoard files in '{folder}': {exc}") from None
    try:
        for name, points in run.series.items():
            for step, value, wall in points:
                writer.add_scalar(name, value, step, walltime=wall or None)
        numbers = {SUMMARY + k: v for k, v in run.summary_numbers().items()}
        for name, value in numbers.items():
            writer.add_scalar(name, value, run.last_step)
        file_writer = writer._get_file_writer()
        for summary in hparams(run.params, numbers):
            file_writer.add_summary(summary)
        writer.add_text("config", _code(run.config_yaml), run.last_step)
        writer.add_text("summary", _code(json.dumps(run.summary, indent=2)), run.last_step)
    finally:
        writer.close()
    return folder


def _code(text: str) -> str:
    """Text shown as it is (TensorBoard renders its text as Markdown)."""
    return "\n".join("    " + line for line in text.splitlines())

"""A run's drift schedule (``drift:``) as ``build`` makes it, with the refusals
that need the task, the data or the algorithm (the config's own are in
config/drift.py): each one line naming what cannot drift and why."""

from __future__ import annotations

from fedforge.algorithms.base import Algorithm
from fedforge.config import Config
from fedforge.core.errors import ConfigError
from fedforge.data.drift import DriftSchedule, schedule_of
from fedforge.data.federated import FederatedData
from fedforge.data.mnist import NUM_CLASSES
from fedforge.tasks import Task


def drift_fits_task(cfg: Config, task: Task) -> None:
    """A drift refused, before the data loads, for a task whose rows are not
    one class id each (a caller's sequence or regression task)."""
    if cfg.drift.on and task.kind != "classification":
        raise ConfigError(
            f"drift.kind = {cfg.drift.kind!r} needs one class id a row; this run's task is "
            f"{task.kind!r}"
        )


def drift_of(cfg: Config, data: FederatedData, algorithm: Algorithm) -> DriftSchedule | None:
    """The run's drift schedule, refused for a clustered algorithm (it picks a
    client's cluster by the loss on its data without the round's drift), for
    data without class ids, and for label_mix with more groups than classes (a
    group without a class would shift nothing)."""
    if cfg.drift.on and data.classes() is None:
        raise ConfigError(
            f"drift.kind = {cfg.drift.kind!r} needs one class id a row; the data's labels "
            "are real-valued targets"
        )
    classes = data.classes() or NUM_CLASSES
    if cfg.drift.kind == "label_mix" and cfg.drift.groups > classes:
        raise ConfigError(
            f"drift.groups = {cfg.drift.groups} is invalid with drift.kind = 'label_mix': at "
            f"most the data's {classes} classes (each group favours its own classes)"
        )
    schedule = schedule_of(cfg.drift, classes, cfg.seed)
    if schedule is not None and algorithm.clusters is not None:
        raise ConfigError(
            f"algorithm {cfg.algorithm!r} cannot run with drift.kind = {cfg.drift.kind!r}: it "
            "picks each client's cluster by the loss on its data without the round's drift"
        )
    return schedule

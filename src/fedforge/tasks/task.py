"""A Task says what is trained and how it is judged: the model (a registry name or
a factory sized by the data's :class:`DataSpec`), the data (the config's data set,
or a loader of the caller's), the per-example loss and the metrics; the kind of
its labels picks the loss and metrics unless the task gives its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedforge.config import Config
from fedforge.config.task import KINDS, Kind, labels_fit_features
from fedforge.core.dataspec import DataSpec
from fedforge.core.errors import ConfigError, DataError
from fedforge.data.federated import FederatedData
from fedforge.models import build_model, seeded
from fedforge.tasks.losses import LossFn, cross_entropy, squared_error, token_cross_entropy
from fedforge.tasks.metrics import ClassMetrics, Metrics, RegressionMetrics, TokenMetrics

LOSSES: dict[str, LossFn] = {
    "classification": cross_entropy,
    "sequence": token_cross_entropy,
    "regression": squared_error,
}
METRICS: dict[str, Callable[[], Metrics]] = {
    "classification": ClassMetrics,
    "sequence": TokenMetrics,
    "regression": RegressionMetrics,
}
if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext

ModelFn = Callable[[DataSpec], nn.Module]
DataFn = Callable[[Config], FederatedData]


@dataclass(frozen=True)
class Task:
    """``model``: a model name (the config's ``model`` when None) or a factory of
    the data's spec; ``data_fn``: the caller's loader (None: the config's data set,
    or the data handed to the run); ``loss_fn``/``metrics``: None takes the kind's."""

    name: str
    kind: Kind = "classification"
    model: str | ModelFn | None = None
    data_fn: DataFn | None = None
    loss_fn: LossFn | None = None
    metrics: Metrics | None = None

    def __post_init__(self) -> None:
        if self.kind not in LOSSES:
            raise ConfigError(
                f"task {self.name!r}: kind = {self.kind!r} is invalid; must be one of "
                f"{', '.join(LOSSES)}"
            )

    def loss(self) -> LossFn:
        return self.loss_fn or LOSSES[self.kind]

    def scores(self) -> Metrics:
        return self.metrics or METRICS[self.kind]()

    def build_model(self, cfg: Config, spec: DataSpec, dtype: torch.dtype) -> nn.Module:
        """A fresh model for data of ``spec``, its initial weights a function of the
        run's seed alone."""
        if self.model is None or isinstance(self.model, str):
            return build_model(self.model or cfg.model, cfg.seed, dtype, spec)
        factory = self.model
        return seeded(lambda: factory(spec), cfg.seed, dtype, f"of task {self.name!r}")

    def check_labels(self, data: FederatedData) -> None:
        """Refuse data whose labels are not this kind's, in one line."""
        y = data.train_y
        if self.kind == "regression" and not y.is_floating_point():
            raise DataError(
                f"task {self.name!r} is a regression: train_y must hold float targets, "
                f"got {y.dtype}"
            )
        if self.kind != "regression" and y.dtype != torch.int64:
            raise DataError(
                f"task {self.name!r} ({self.kind}) needs int64 class ids in train_y, got {y.dtype}"
            )
        if self.kind == "sequence" and y.dim() != 2:
            raise DataError(
                f"task {self.name!r} predicts sequences: train_y must be [rows, steps], "
                f"got shape {tuple(y.shape)}"
            )


def check_run_fits(cfg: Config, task: Task, data: FederatedData) -> None:
    """What the config asks of the labels and inputs, against the data the run
    got (a task of the caller's, or data handed to the run): one line each."""
    y = data.train_y
    kind: Kind = "regression" if y.is_floating_point() else "sequence" if y.dim() > 1 else task.kind
    groups = cfg.communication
    labels_fit_features(
        cfg.dataset,
        cfg.partition,
        cfg.aggregation.weights,
        cfg.robust,
        groups.group_by if groups.groups else "none",
        kind,
    )
    shape = tuple(data.train_x.shape[1:])
    if cfg.partition.feature_shift and shape != (1, 28, 28):
        raise ConfigError(
            f"partition.feature_shift transforms 28x28 images; the data's rows are {shape}"
        )


def config_task(cfg: Config) -> Task:
    """The task of the config's data set and model (``dataset``/``model``, or the
    pair a built-in task names): its data set's kind of labels, its model."""
    name = cfg.task or f"{cfg.dataset}-{cfg.model}"
    return Task(name, KINDS.get(cfg.dataset, "classification"))


def data_set_task(context: ComponentContext) -> Task:
    """The factory of every built-in task (core/builtins.py): the task of the data
    set and model it names, which the config has taken as its own."""
    return config_task(context.cfg)

"""The built-in metrics a config names in ``metrics`` (registered in
core/builtins.py through the same ``register`` as anyone's): each a
:class:`~fedforge.tasks.metrics.Metric`, additive statistics a batch and the
figure from their total."""

from __future__ import annotations

import torch

from fedforge.config import Config
from fedforge.config.components import ComponentContext, make
from fedforge.core.errors import ConfigError
from fedforge.tasks.losses import PAD
from fedforge.tasks.metrics import Metric


class Accuracy:
    """The fraction of rows whose arg-max class is the label (logits ``[B, C]``)."""

    def batch(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hits = int((outputs.argmax(dim=1) == labels).sum())
        return torch.tensor([hits, len(labels)], dtype=torch.float64)

    def value(self, total: torch.Tensor) -> float:
        return float(total[0] / total[1]) if total[1] > 0 else float("nan")


class TokenAccuracy:
    """The fraction of steps whose arg-max is the label, over steps not ``PAD``
    (logits ``[B, T, C]``)."""

    def batch(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        ids, scored = labels.flatten(), labels.flatten() != PAD
        hits = int(((outputs.flatten(0, 1).argmax(dim=1) == ids) & scored).sum())
        return torch.tensor([hits, int(scored.sum())], dtype=torch.float64)

    def value(self, total: torch.Tensor) -> float:
        return float(total[0] / total[1]) if total[1] > 0 else float("nan")


class MeanSquaredError:
    """The mean squared error of predictions against real targets, per target value."""

    def batch(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        diff = outputs.reshape(labels.shape).double() - labels.double()
        return torch.tensor([float(diff.square().sum()), labels.numel()], dtype=torch.float64)

    def value(self, total: torch.Tensor) -> float:
        return float(total[0] / total[1]) if total[1] > 0 else float("nan")


def accuracy(context: ComponentContext) -> Accuracy:
    return Accuracy()


def token_accuracy(context: ComponentContext) -> TokenAccuracy:
    return TokenAccuracy()


def mse(context: ComponentContext) -> MeanSquaredError:
    return MeanSquaredError()


def from_config(cfg: Config) -> tuple[tuple[str, Metric], ...]:
    """The metrics ``cfg.evaluation.metrics`` names, by name, each built by its
    registered factory."""
    built = []
    for name in cfg.evaluation.metrics:
        metric: Metric = make("metric", name, cfg, "evaluation.metrics")
        for method in ("batch", "value"):
            if not callable(getattr(metric, method, None)):
                raise ConfigError(
                    f"metrics: metric {name!r} has no {method}() (a Metric: batch(outputs, "
                    "labels) -> statistics, value(total) -> float)"
                )
        built.append((name, metric))
    return tuple(built)

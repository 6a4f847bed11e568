"""How a task's model is judged on a labelled set: one headline score (higher is
better: what ``target_accuracy`` stops at) and the mean loss, from sums over
batches. Classification: accuracy and mean cross-entropy over rows. Sequence
prediction: accuracy and cross-entropy over every scored step (per-token: each
character of a Shakespeare test text once). Regression: the coefficient of
determination R^2 = 1 - SSE/SST as the score, the mean squared error as the loss."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch.nn import functional

from fedforge.core import registry
from fedforge.tasks.losses import PAD

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext


@dataclass(frozen=True)
class Scores:
    """A model's score (``score_name``), mean loss and the predictions scored."""

    score: float
    loss: float
    scored: int


class Metrics(Protocol):
    score_name: str  # a task's own metrics may also say ``score_range`` (low, high)

    def sums(self, outputs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, int]:
        """One batch's (loss sum, score sum, predictions scored)."""
        ...

    def finish(self, loss: float, score: float, scored: int, labels: torch.Tensor) -> Scores:
        """The scores from the batches' totals (``labels``: the whole set's)."""
        ...


class Metric(Protocol):
    """An evaluation figure beyond the task's score (``metrics: [NAME]``), computed
    over a whole evaluated set from additive statistics: ``batch`` gives one
    batch's (a float64 tensor of fixed shape: counts, sums, a confusion matrix),
    the batches' statistics are summed, and ``value`` turns the total into the
    figure. Both are pure functions, so the figure does not depend on the batch
    size beyond float rounding and a rerun gives the same bits."""

    def batch(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One batch's statistics (``outputs``: the model's, on its device)."""
        ...

    def value(self, total: torch.Tensor) -> float:
        """The figure from the summed statistics (float64, on the host)."""
        ...


def register_metric(
    name: str,
    factory: Callable[[ComponentContext], Metric],
    *,
    options: type | None = None,
    replace: bool = False,
) -> None:
    """Register ``factory`` as the metric ``name`` (``metrics: [NAME]``): it returns
    a :class:`Metric`, recorded under ``name`` at every evaluation of the global
    model on the test set (the run store's ``eval_metrics`` table)."""
    registry.register("metric", name, factory, options=options, replace=replace)


class ClassMetrics:
    """Accuracy and mean cross-entropy over rows of logits ``[B, C]``."""

    score_name = "accuracy"
    score_range = (0.0, 1.0)  # the values a score can take

    def sums(self, outputs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, int]:
        loss = float(functional.cross_entropy(outputs, labels, reduction="sum"))
        return loss, int((outputs.argmax(dim=1) == labels).sum()), len(labels)

    def finish(self, loss: float, score: float, scored: int, labels: torch.Tensor) -> Scores:
        return Scores(score / scored, loss / scored, scored)


class TokenMetrics:
    """Per-step accuracy and cross-entropy of logits ``[B, T, C]`` over the steps
    whose label is not ``PAD``."""

    score_name = "token accuracy"
    score_range = (0.0, 1.0)  # the values a score can take

    def sums(self, outputs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, int]:
        flat, ids = outputs.flatten(0, 1), labels.flatten()
        loss = float(functional.cross_entropy(flat, ids, ignore_index=PAD, reduction="sum"))
        hits = int(((flat.argmax(dim=1) == ids) & (ids != PAD)).sum())
        return loss, hits, int((ids != PAD).sum())

    def finish(self, loss: float, score: float, scored: int, labels: torch.Tensor) -> Scores:
        return Scores(score / max(scored, 1), loss / max(scored, 1), scored)


class RegressionMetrics:
    """R^2 and the mean squared error of predictions against real targets."""

    score_name = "R^2"
    score_range = (-math.inf, 1.0)  # the values a score can take

    def sums(self, outputs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, int]:
        sse = float((outputs.reshape(labels.shape) - labels).double().square().sum())
        return sse, sse, labels.numel()

    def finish(self, loss: float, score: float, scored: int, labels: torch.Tensor) -> Scores:
        # SST about each target's own mean (several targets a row: their pooled R^2);
        # constant targets: 1 for an exact fit, else 0
        y = labels.double().reshape(len(labels), -1)
        sst = float((y - y.mean(dim=0)).square().sum()) if len(y) else 0.0
        r2 = 1.0 - score / sst if sst > 0 else float(score == 0.0)
        return Scores(r2, loss / max(scored, 1), scored)

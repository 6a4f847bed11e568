"""Evaluation of a flat parameter vector on a labelled set: batched, no autograd,
scored by the run's task (fedforge.tasks.metrics), on the model's device (the
run's ``device``): the parameters and each batch go there, the scores come back
as Python numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call

from fedforge.core.device import module_device
from fedforge.core.params import ParamSpec
from fedforge.tasks.metrics import ClassMetrics, Metric, Metrics


@dataclass(frozen=True)
class EvalResult:
    """The task's score (classification: accuracy; sequence: per-token accuracy;
    regression: R^2), its mean loss, the rows evaluated, and the figures of the
    run's named metrics (``metrics: [...]``) by name."""

    accuracy: float
    loss: float
    num_examples: int
    extra: dict[str, float] = field(default_factory=dict)


def evaluate(
    model: nn.Module,
    spec: ParamSpec,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 250,
    metrics: Metrics | None = None,
    extra: Sequence[tuple[str, Metric]] = (),
) -> EvalResult:
    """The score and mean loss of ``params`` on ``(x, y)`` (``metrics``: the task's;
    None: classification, accuracy and mean cross-entropy), and each named metric
    of ``extra`` from the same forward passes: its batches' statistics summed in
    float64 on the host, then its value."""
    metrics = metrics or ClassMetrics()
    device = module_device(model)
    tensors = spec.views(params.to(device))
    model.eval()
    loss_sum, score_sum, scored = 0.0, 0.0, 0
    totals: list[torch.Tensor | None] = [None] * len(extra)
    with torch.inference_mode():
        for start in range(0, len(y), batch_size):
            xb = x[start : start + batch_size].to(device)
            yb = y[start : start + batch_size].to(device)
            outputs = functional_call(model, tensors, (xb,))
            loss, score, count = metrics.sums(outputs, yb)
            for i, (_, metric) in enumerate(extra):
                stats = metric.batch(outputs, yb).to("cpu", torch.float64)
                before = totals[i]
                totals[i] = stats if before is None else before + stats
            loss_sum += loss
            score_sum += score
            scored += count
    scores = metrics.finish(loss_sum, score_sum, scored, y)
    figures = {
        name: metric.value(total) if total is not None else float("nan")
        for (name, metric), total in zip(extra, totals, strict=True)
    }
    return EvalResult(scores.score, scores.loss, len(y), figures)

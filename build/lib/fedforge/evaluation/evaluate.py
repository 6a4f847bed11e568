"""Evaluation of a flat parameter vector on a labelled set: batched, no autograd,
scored by the run's task (fedforge.tasks.metrics), on the model's device (the
run's ``device``): the parameters and each batch go there, the scores come back
as Python numbers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from fedforge.core.device import module_device
from fedforge.core.params import ParamSpec
from fedforge.tasks.metrics import ClassMetrics, Metrics


@dataclass(frozen=True)
class EvalResult:
    """The task's score (classification: accuracy; sequence: per-token accuracy;
    regression: R^2), its mean loss, and the rows evaluated."""

    accuracy: float
    loss: float
    num_examples: int


def evaluate(
    model: nn.Module,
    spec: ParamSpec,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 250,
    metrics: Metrics | None = None,
) -> EvalResult:
    """The score and mean loss of ``params`` on ``(x, y)`` (``metrics``: the task's;
    None: classification, accuracy and mean cross-entropy)."""
    metrics = metrics or ClassMetrics()
    device = module_device(model)
    tensors = spec.views(params.to(device))
    model.eval()
    loss_sum, score_sum, scored = 0.0, 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(y), batch_size):
            xb = x[start : start + batch_size].to(device)
            yb = y[start : start + batch_size].to(device)
            loss, score, count = metrics.sums(functional_call(model, tensors, (xb,)), yb)
            loss_sum += loss
            score_sum += score
            scored += count
    scores = metrics.finish(loss_sum, score_sum, scored, y)
    return EvalResult(scores.score, scores.loss, len(y))

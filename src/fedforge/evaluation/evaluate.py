"""Evaluation of a flat parameter vector on a labelled set: batched, no autograd."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from fedforge.core.params import ParamSpec


@dataclass(frozen=True)
class EvalResult:
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
) -> EvalResult:
    """Accuracy and mean cross-entropy of ``params`` on ``(x, y)``."""
    tensors = spec.views(params)
    model.eval()
    correct = 0
    loss_sum = 0.0
    with torch.inference_mode():
        for start in range(0, len(y), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            logits = functional_call(model, tensors, (xb,))
            loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(dim=1) == yb).sum())
    n = len(y)
    return EvalResult(correct / n, loss_sum / n, n)

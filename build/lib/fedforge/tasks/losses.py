"""Per-example losses ``[B]`` of each kind of task: engines mask padded examples,
a minibatch's objective is their mean. ``(outputs, labels) -> losses``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional

from fedforge.core.dataspec import PAD

# (model outputs, labels) -> per-example losses [B]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Classification: the cross-entropy of logits ``[B, C]`` against class ids ``[B]``."""
    return functional.cross_entropy(logits, labels, reduction="none")


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sequence prediction: logits ``[B, T, C]``, class ids ``[B, T]`` (``PAD`` at
    padding). A row's loss is the sum of its steps' cross-entropies over ``T``, so
    a batch's mean is the mean over its characters wherever rows are full, and a
    padded step weighs nothing."""
    steps = labels.shape[-1]
    each = functional.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=PAD, reduction="none"
    )
    return each.view(labels.shape).sum(dim=-1) / steps


def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Regression: a row's mean squared error over its target values."""
    diff = outputs.reshape(targets.shape) - targets
    return diff.square().reshape(len(targets), -1).mean(dim=1)

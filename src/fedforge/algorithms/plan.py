"""What a client does in one round: its local training plan and its loss."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# (logits [B, C], labels [B]) -> per-example losses [B]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LocalPlan:
    """What every client of one round does: ``local_epochs`` passes of minibatch SGD
    over its data in batches of ``batch_size`` (``None``: the whole client data set,
    the paper's B = infinity) at learning rate ``lr``; optionally with heavy-ball
    ``momentum``, ``weight_decay`` (both as ``torch.optim.SGD``) and the gradient
    clipped to L2 norm ``grad_clip`` at every step (see algorithms/local.py)."""

    local_epochs: int
    batch_size: int | None
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None
    precision: str = "fp32"  # "bf16": forward passes under bf16 autocast (precision.py)

    @property
    def plain(self) -> bool:
        """True for plain SGD (no knob set): the engines' fast path."""
        return self.momentum == 0.0 and self.weight_decay == 0.0 and self.grad_clip is None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy ``[B]``: the classification loss of every MNIST
    experiment. Losses are per example so that engines can mask padded ones; a
    minibatch's objective is their mean."""
    return torch.nn.functional.cross_entropy(logits, labels, reduction="none")

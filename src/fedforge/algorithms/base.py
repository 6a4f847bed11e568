"""What an algorithm is (DESIGN idea 3): a small bundle, not a subclass tree.

A bundle holds what a client optimises and how (the local training plan of
each round) and which parameters are shared. Aggregators and server
optimizers compose with any bundle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedforge.params import ParamKind

if TYPE_CHECKING:
    from fedforge.algorithms.local import (
        ClientTerms,
        GradHook,
        LocalTrain,
        PersonalEntries,
        ServerTerms,
    )

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


@dataclass(frozen=True)
class Algorithm:
    """An FL algorithm: the client plan per round, the loss and what is shared.
    The server optimizer is not part of it: any composes with any algorithm
    (FedAdam is FedAvg with another server optimizer, see server/optimizers.py)."""

    name: str
    plan_fn: Callable[[int], LocalPlan]
    loss_fn: LossFn
    shared_kinds: tuple[ParamKind, ...] = ("weight", "batchnorm", "buffer")
    # a term added to every local gradient (FedProx's proximal term, SCAFFOLD's correction)
    grad_hook: GradHook | None = None
    client: ClientTerms | None = None  # per-client state and extra update tensors (SCAFFOLD)
    server: ServerTerms | None = None  # server state, payload extras and their update
    personal: PersonalEntries | None = None  # entries each client keeps (FedBN's batch norm)
    drop_stragglers: bool = True  # FedAvg drops clients that did fewer epochs; FedProx keeps them
    # its own local loop instead of client.local_sgd (Per-FedAvg's meta-steps); the
    # serial engine and worker processes run it, the vectorised engine falls back
    local_train: LocalTrain | None = None

    def plan(self, round_idx: int) -> LocalPlan:
        return self.plan_fn(round_idx)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy ``[B]``: the classification loss of every MNIST
    experiment. Losses are per example so that engines can mask padded ones; a
    minibatch's objective is their mean."""
    return torch.nn.functional.cross_entropy(logits, labels, reduction="none")

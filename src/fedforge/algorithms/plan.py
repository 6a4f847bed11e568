"""What a client does in one round: its local training plan and its loss."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedforge.config import LocalConfig
from fedforge.tasks.losses import LossFn, cross_entropy

__all__ = ["DecayedPlan", "LocalPlan", "LossFn", "cross_entropy"]


@dataclass(frozen=True)
class LocalPlan:
    """What every client of one round does: ``local_epochs`` passes of minibatch SGD
    over its data in batches of ``batch_size`` (``None``: the whole client data set,
    the paper's B = infinity) at learning rate ``lr``; optionally with heavy-ball
    ``momentum``, ``weight_decay`` (both as ``torch.optim.SGD``) and the gradient
    clipped to L2 norm ``grad_clip`` at every step (see algorithms/local.py). The
    server may set ``upload_clip`` for a round: the client clips its delta to that
    L2 norm before its stages and codec; with ``report_norm`` it also reports the
    delta's L2 norm before that clip in its update's header, clipped or not
    (``communication.clip_multiple``: server/client_lr.py)."""

    local_epochs: int
    batch_size: int | None
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None
    precision: str = "fp32"  # "bf16": forward passes under bf16 autocast (precision.py)
    upload_clip: float | None = None  # the round's bound on the delta's L2 norm
    report_norm: bool = False  # report the delta's norm before upload_clip

    @classmethod
    def from_config(
        cls,
        local: LocalConfig,
        local_epochs: int,
        batch_size: int | None,
        lr: float,
        precision: str = "fp32",
    ) -> LocalPlan:
        """The plan of a run's ``local:`` section and its E, B, lr and precision."""
        return cls(
            local_epochs,
            batch_size,
            lr,
            local.momentum,
            local.weight_decay,
            local.grad_clip,
            precision,
        )

    @property
    def plain(self) -> bool:
        """True for plain SGD (no knob set): the engines' fast path."""
        return self.momentum == 0.0 and self.weight_decay == 0.0 and self.grad_clip is None


@dataclass(frozen=True)
class DecayedPlan:
    """Round t's plan: ``plan`` with its lr decayed, lr_t = lr * lr_decay ** t. A
    class, not a closure, so that the bundle pickles for remote engines."""

    plan: LocalPlan
    lr_decay: float = 1.0

    def __call__(self, round_idx: int) -> LocalPlan:
        return dataclasses.replace(self.plan, lr=self.plan.lr * self.lr_decay**round_idx)

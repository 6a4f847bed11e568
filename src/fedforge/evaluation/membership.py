"""Membership-inference audit of a trained model: the loss-threshold attack of
Yeom et al. 2018 ("Privacy risk in machine learning: analyzing the connection to
overfitting"). The attacker guesses "member" for an example whose loss under the
model is below a threshold; over all thresholds its power is the ROC curve of
the score -loss, members (examples the clients trained on) against non-members
(held-out examples of the same distribution). Reported: the area under that
curve (0.5: the model tells nothing of membership; 1.0: every member has a
lower loss than every non-member) and the membership advantage, the largest
true-positive minus false-positive rate over thresholds (Yeom et al.'s Adv).

The AUC is the Mann-Whitney statistic U / (n_pos n_neg) on mid-ranks, so tied
scores count one half, as every ROC implementation scores ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedforge.core.device import module_device
from fedforge.core.params import ParamSpec
from fedforge.core.rng import numpy_rng
from fedforge.tasks.losses import LossFn


@dataclass(frozen=True)
class MembershipAudit:
    """The attack's figures on one model: ``auc`` and ``advantage`` (above),
    how many members and non-members were scored, and their mean losses."""

    auc: float
    advantage: float
    members: int
    nonmembers: int
    member_loss: float
    nonmember_loss: float


def _as_array(values: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().numpy()
    return np.asarray(values, dtype=np.float64).ravel()


def _check(positive: np.ndarray, negative: np.ndarray) -> None:
    if len(positive) == 0 or len(negative) == 0:
        raise ValueError(
            f"the attack needs members and non-members; got {len(positive)} and {len(negative)}"
        )
    if not (np.isfinite(positive).all() and np.isfinite(negative).all()):
        raise ValueError("the attack's scores hold NaN or inf (a diverged model's losses?)")


def roc_auc(positive: torch.Tensor | np.ndarray, negative: torch.Tensor | np.ndarray) -> float:
    """P(score of a positive > score of a negative) + P(tie) / 2: the area under
    the ROC curve of a score that should be higher on ``positive``."""
    pos, neg = _as_array(positive), _as_array(negative)
    _check(pos, neg)
    both = np.concatenate([pos, neg])
    values, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # rank (from 0) of each value's first copy
    mid_rank = first + (counts - 1) / 2.0 + 1.0  # 1-based mid-ranks
    rank_sum = float(mid_rank[inverse[: len(pos)]].sum())
    u = rank_sum - len(pos) * (len(pos) + 1) / 2.0
    return u / (len(pos) * len(neg))


def best_advantage(
    positive: torch.Tensor | np.ndarray, negative: torch.Tensor | np.ndarray
) -> float:
    """max over thresholds t of P(pos >= t) - P(neg >= t): the membership
    advantage of the best single threshold on the score."""
    pos, neg = np.sort(_as_array(positive)), np.sort(_as_array(negative))
    _check(pos, neg)
    thresholds = np.unique(np.concatenate([pos, neg]))
    tpr = 1.0 - np.searchsorted(pos, thresholds, side="left") / len(pos)
    fpr = 1.0 - np.searchsorted(neg, thresholds, side="left") / len(neg)
    return float(max(0.0, (tpr - fpr).max()))


def loss_threshold_attack(
    member_losses: torch.Tensor | np.ndarray, nonmember_losses: torch.Tensor | np.ndarray
) -> MembershipAudit:
    """The attack on given per-example losses: the score is -loss."""
    mem, non = _as_array(member_losses), _as_array(nonmember_losses)
    return MembershipAudit(
        auc=roc_auc(-mem, -non),
        advantage=best_advantage(-mem, -non),
        members=len(mem),
        nonmembers=len(non),
        member_loss=float(mem.mean()) if len(mem) else float("nan"),
        nonmember_loss=float(non.mean()) if len(non) else float("nan"),
    )


def per_example_losses(
    model: nn.Module,
    spec: ParamSpec,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    batch_size: int = 500,
) -> torch.Tensor:
    """The loss of ``params`` on each row of ``(x, y)``, float64 on the host."""
    device = module_device(model)
    tensors = spec.views(params.to(device))
    model.eval()
    out = []
    with torch.inference_mode():
        for start in range(0, len(y), batch_size):
            xb = x[start : start + batch_size].to(device)
            yb = y[start : start + batch_size].to(device)
            out.append(loss_fn(functional_call(model, tensors, (xb,)), yb).double().cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def audit_model(
    model: nn.Module,
    spec: ParamSpec,
    params: torch.Tensor,
    members: tuple[torch.Tensor, torch.Tensor],
    nonmembers: tuple[torch.Tensor, torch.Tensor],
    loss_fn: LossFn,
) -> MembershipAudit:
    """The loss-threshold attack on ``params``: ``members`` are rows the clients
    trained on, ``nonmembers`` held-out rows of the same distribution."""
    mem = per_example_losses(model, spec, params, *members, loss_fn)
    non = per_example_losses(model, spec, params, *nonmembers, loss_fn)
    return loss_threshold_attack(mem, non)


def balanced_rows(
    member_rows: np.ndarray, nonmember_rows: np.ndarray, count: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Equal numbers of member and non-member row indices: ``count`` of each (at
    most the smaller pool; None: the smaller pool), drawn without replacement."""
    n = min(len(member_rows), len(nonmember_rows))
    if count is not None:
        n = min(n, count)
    rng = numpy_rng(seed, "membership_audit")
    mem = np.sort(rng.choice(member_rows, n, replace=False))
    non = np.sort(rng.choice(nonmember_rows, n, replace=False))
    return mem, non


__all__ = [
    "MembershipAudit",
    "audit_model",
    "balanced_rows",
    "best_advantage",
    "loss_threshold_attack",
    "per_example_losses",
    "roc_auc",
]

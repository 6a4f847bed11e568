"""FedAvg and FedSGD: McMahan et al. 2017, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", Algorithm 1.

Runs on the clients (E epochs of minibatch SGD of size B from the global weights)
and on the server (the n_k-weighted mean of the deltas, applied with server SGD
at lr 1: the default server optimizer). Trusts each client's reported ``num_examples``.
FedSGD is the special case E = 1, B = infinity: one full-batch gradient step per
client, which averaged with weights n_k is one gradient step on the union.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.algorithms.base import Algorithm, LocalPlan, cross_entropy


@dataclass(frozen=True)
class _DecayedPlan:
    """Local lr decayed per round: lr_t = lr * decay ** round_idx. A class, not a
    closure, so that the bundle pickles for remote engines."""

    local_epochs: int
    batch_size: int | None
    lr: float
    lr_decay: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None

    def __call__(self, round_idx: int) -> LocalPlan:
        lr = self.lr * self.lr_decay**round_idx
        return LocalPlan(
            self.local_epochs,
            self.batch_size,
            lr,
            self.momentum,
            self.weight_decay,
            self.grad_clip,
        )


def fedavg(
    local_epochs: int,
    batch_size: int | None,
    lr: float,
    lr_decay: float = 1.0,
    drop_stragglers: bool = True,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    grad_clip: float | None = None,
) -> Algorithm:
    """FedAvg with E = ``local_epochs``, B = ``batch_size`` (None: infinity); the
    local knobs (momentum, weight decay, clipping) are those of ``LocalPlan``.
    Stragglers (clients that did fewer epochs) are dropped, as in the paper."""
    plan = _DecayedPlan(local_epochs, batch_size, lr, lr_decay, momentum, weight_decay, grad_clip)
    return Algorithm("fedavg", plan, cross_entropy, drop_stragglers=drop_stragglers)


def fedsgd(
    lr: float,
    lr_decay: float = 1.0,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    grad_clip: float | None = None,
) -> Algorithm:
    """FedSGD: every client takes one gradient step on all its data (FedAvg with
    E = 1, B = infinity, the same local knobs)."""
    plan = _DecayedPlan(1, None, lr, lr_decay, momentum, weight_decay, grad_clip)
    return Algorithm("fedsgd", plan, cross_entropy)

"""FedAvg and FedSGD: McMahan et al. 2017, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", Algorithm 1.

Runs on the clients (E epochs of minibatch SGD of size B from the global weights)
and on the server (the n_k-weighted mean of the deltas, applied with server SGD
at lr 1: the default server optimizer). Trusts each client's reported ``num_examples``.
FedSGD is the special case E = 1, B = infinity: one full-batch gradient step per
client, which averaged with weights n_k is one gradient step on the union.
"""

from __future__ import annotations

import dataclasses

from fedforge.algorithms.base import Algorithm, LocalPlan, cross_entropy
from fedforge.algorithms.plan import DecayedPlan


def fedavg(plan: LocalPlan, lr_decay: float = 1.0, drop_stragglers: bool = True) -> Algorithm:
    """FedAvg with E = ``plan.local_epochs``, B = ``plan.batch_size`` (None:
    infinity), the local knobs (momentum, weight decay, clipping) of ``plan``, its
    lr decayed by ``lr_decay`` a round. Stragglers (clients that did fewer epochs)
    are dropped, as in the paper."""
    return Algorithm(
        "fedavg", DecayedPlan(plan, lr_decay), cross_entropy, drop_stragglers=drop_stragglers
    )


def fedsgd(plan: LocalPlan, lr_decay: float = 1.0) -> Algorithm:
    """FedSGD: every client takes one gradient step on all its data (FedAvg with
    E = 1, B = infinity, the local knobs of ``plan``)."""
    one_step = dataclasses.replace(plan, local_epochs=1, batch_size=None)
    return Algorithm("fedsgd", DecayedPlan(one_step, lr_decay), cross_entropy)

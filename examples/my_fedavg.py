"""FedAvg (McMahan et al. 2017, "Communication-Efficient Learning of Deep
Networks from Decentralized Data"), written outside the package (docs/tutorial.md).

A round: each sampled client runs E epochs of minibatch SGD (B, lr) from the
global model w_t on its loss; the server takes the example-weighted mean of
the deltas. Stragglers (clients that did fewer epochs) are dropped.

    fedforge run --plugin examples/my_fedavg.py --config examples/my_fedavg.yaml
"""

from __future__ import annotations

import fedforge
from fedforge.algorithms import drops_stragglers, local_plan
from fedforge.algorithms.plan import DecayedPlan, cross_entropy


def factory(context: fedforge.ComponentContext) -> fedforge.Algorithm:
    cfg = context.cfg
    return fedforge.Algorithm(
        "my_fedavg",
        DecayedPlan(local_plan(cfg), cfg.lr_decay),  # round t: E, B and lr * lr_decay**t
        cross_entropy,  # the run's task puts its own loss here
        drop_stragglers=drops_stragglers(cfg, True),  # stragglers.drop, else True
    )


fedforge.register_algorithm("my_fedavg", factory)

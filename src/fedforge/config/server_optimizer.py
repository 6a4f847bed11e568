"""The ``server_optimizer`` section: how the server applies the aggregated delta."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fedforge.config.ranges import Range

ServerOptimizerKind = str  # sgd, adagrad, adam, yogi or a plugin's (registered names)


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """How the server applies the aggregated delta (Reddi et al. 2021). ``sgd``
    with ``momentum`` 0 and ``lr`` 1 is FedAvg; momentum > 0 is FedAvgM."""

    kind: ServerOptimizerKind = "sgd"
    # the server's step on the pseudo-gradient, every kind's (how it fits the
    # run's dtype is checked with the run's lr: schema.py)
    lr: float = 1.0
    momentum: Annotated[float, Range("[0, 1)")] = 0.0  # sgd only
    beta1: Annotated[float, Range("[0, 1)")] = 0.9
    beta2: Annotated[float, Range("[0, 1)")] = 0.99
    tau: Annotated[float, Range("> 0")] = 1e-3  # adaptivity: added to sqrt(v)
    bias_correction: bool = False  # True: torch.optim.Adam's form

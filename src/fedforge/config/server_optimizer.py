"""The ``server_optimizer`` section: how the server applies the aggregated delta."""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.core.errors import raise_first

ServerOptimizerKind = str  # sgd, adagrad, adam, yogi or a plugin's (registered names)


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """How the server applies the aggregated delta (Reddi et al. 2021). ``sgd``
    with ``momentum`` 0 and ``server_lr`` 1 is FedAvg; momentum > 0 is FedAvgM."""

    kind: ServerOptimizerKind = "sgd"
    momentum: float = 0.0  # sgd only
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3  # adaptivity: added to sqrt(v)
    bias_correction: bool = False  # True: torch.optim.Adam's form

    def check(self) -> None:
        raise_first(
            "server_optimizer.",
            [
                ("momentum", self.momentum, 0.0 <= self.momentum < 1.0, "must be in [0, 1)"),
                ("beta1", self.beta1, 0.0 <= self.beta1 < 1.0, "must be in [0, 1)"),
                ("beta2", self.beta2, 0.0 <= self.beta2 < 1.0, "must be in [0, 1)"),
                ("tau", self.tau, self.tau > 0, "must be > 0"),
            ],
        )

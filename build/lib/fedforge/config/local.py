"""Config sections of local training: the local optimizer's knobs, stragglers
(clients doing fewer epochs), SCAFFOLD's client control update and
Per-FedAvg's local meta-update. Each section checks its own fields, with
errors naming the field; how they combine with the rest of the run is checked
in compat.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fedforge.core.errors import raise_first

# the local weight decay's allowed values (its section and compat.py check it)
WEIGHT_DECAY_RANGE = "must be >= 0 (lr * weight_decay below 3.4e38 in a float32 run)"


def step_limit(dtype: str) -> float:
    """The largest step-size product a run of ``dtype`` holds (float32's: 3.4e38)."""
    return 3.4028234663852886e38 if dtype == "float32" else math.inf


@dataclass(frozen=True)
class LocalConfig:
    """Local optimizer knobs, the same in every engine (algorithms/local.py)."""

    momentum: float = 0.0  # heavy-ball momentum, as torch.optim.SGD (dampening 0)
    weight_decay: float = 0.0  # L2 term added to the gradient, as torch.optim.SGD
    grad_clip: float | None = None  # clip each step's gradient to this L2 norm; null = off

    def check(self) -> None:
        raise_first(
            "local.",
            [
                ("momentum", self.momentum, 0.0 <= self.momentum < 1.0, "must be in [0, 1)"),
                ("weight_decay", self.weight_decay, self.weight_decay >= 0.0, WEIGHT_DECAY_RANGE),
                (
                    "grad_clip",
                    self.grad_clip,
                    self.grad_clip is None or self.grad_clip > 0.0,
                    "must be a number > 0, or null (no clipping)",
                ),
            ],
        )


@dataclass(frozen=True)
class StragglerConfig:
    """Systems heterogeneity as in FedProx (Li et al. 2020, section 5.2)."""

    fraction: float = 0.0  # of each cohort, drawn from the seed, doing fewer epochs
    drop: bool | None = None  # drop stragglers' work; null = the algorithm's default

    def check(self) -> None:
        ok = 0.0 <= self.fraction <= 1.0
        raise_first("stragglers.", [("fraction", self.fraction, ok, "must be in [0, 1]")])


@dataclass(frozen=True)
class ScaffoldConfig:
    """SCAFFOLD's client control update (Karimireddy et al. 2020, Algorithm 1)."""

    option: Literal["I", "II"] = "II"  # I: full local gradient at x; II: from the steps


@dataclass(frozen=True)
class PerFedAvgConfig:
    """Per-FedAvg's local meta-update (Fallah et al. 2020; algorithms/perfedavg.py)."""

    variant: Literal["fo", "hf"] = "fo"  # fo: first order; hf: Hessian-free
    alpha: float = 0.01  # inner step: w' = w - alpha grad f(w; D)
    beta: float | None = None  # outer step; null: the run's lr (decayed by lr_decay like it)
    steps: int = 10  # tau: meta-steps per round, each on fresh batches D, D' (and D'')
    hvp: Literal["exact", "finite_difference"] = "exact"  # hf: H(w; D'') v
    delta: float = 1e-3  # finite_difference: (g(w + delta v) - g(w - delta v)) / (2 delta)

    def check(self) -> None:
        raise_first(
            "perfedavg.",
            [
                ("alpha", self.alpha, self.alpha >= 0.0, "must be a number >= 0"),
                (
                    "beta",
                    self.beta,
                    self.beta is None or self.beta > 0.0,
                    "must be a number > 0, or null (the run's lr)",
                ),
                ("steps", self.steps, self.steps >= 1, "must be an integer >= 1 (tau)"),
                ("delta", self.delta, self.delta > 0.0, "must be a number > 0"),
            ],
        )

    def outer_lr(self, lr: float) -> float:
        """The outer step beta: its own, or the run's ``lr``."""
        return self.beta if self.beta is not None else lr

"""Config sections of local training: the local optimizer's knobs, stragglers
(clients doing fewer epochs), FedProx's proximal term, SCAFFOLD's client
control update and Per-FedAvg's local meta-update. Each section checks its own fields, with
errors naming the field; how they combine with the rest of the run is checked
in compat.py."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_STEPS
from fedforge.config.ranges import Most, Range
from fedforge.core.errors import ConfigError, invalid_field

# the local weight decay's allowed values (its section checks the range, compat.py
# the product with lr, in the same words)
WEIGHT_DECAY = Range(">= 0", note="lr * weight_decay below 3.4e38 in a float32 run")
WEIGHT_DECAY_RANGE = WEIGHT_DECAY.says(integer=False)
# FedProx's mu: its section checks the range, compat.py the product with lr
PROXIMAL = Range(
    ">= 0", note="FedProx's proximal coefficient; lr * mu below 3.4e38 in a float32 run"
)
PROXIMAL_RANGE = PROXIMAL.says(integer=False)


def step_limit(dtype: str) -> float:
    """The largest step-size product a run of ``dtype`` holds (float32's: 3.4e38)."""
    return 3.4028234663852886e38 if dtype == "float32" else math.inf


@dataclass(frozen=True)
class LocalConfig:
    """Local optimizer knobs, the same in every engine (algorithms/local.py)."""

    # heavy-ball momentum, as torch.optim.SGD (dampening 0)
    momentum: Annotated[float, Range("[0, 1)")] = 0.0
    # L2 term added to the gradient, as torch.optim.SGD (how it fits lr: compat.py)
    weight_decay: Annotated[float, WEIGHT_DECAY] = 0.0
    # clip each step's gradient to this L2 norm; null = off
    grad_clip: Annotated[float | None, Range("> 0", null="no clipping")] = None
    # each client's lr scaled by this registered rule (server/client_lr.py: data_size,
    # reported_loss, lr_csv or a plugin's; its options under plugin_options); null = off
    lr_rule: str | None = None
    # a client the rule speeds up s-fold (s > 1) gets s times the bound of
    # robust.max_norm_multiple and of communication.clip_multiple; false: every
    # client is held to the round's bounds (measured safer: docs/results.md, client_lr.py)
    lr_rule_scales_bounds: bool = False

    def check(self) -> None:
        if self.lr_rule_scales_bounds and self.lr_rule is None:
            raise ConfigError(
                "config field 'local.lr_rule_scales_bounds' = true is invalid: it scales "
                "the bounds of the clients a local.lr_rule speeds up, and local.lr_rule "
                "is null: name a rule or set it to false"
            )


@dataclass(frozen=True)
class StragglerConfig:
    """Systems heterogeneity as in FedProx (Li et al. 2020, section 5.2)."""

    # of each cohort, drawn from the seed, doing fewer epochs
    fraction: Annotated[float, Range("[0, 1]")] = 0.0
    drop: bool | None = None  # drop stragglers' work; null = the algorithm's default


@dataclass(frozen=True)
class FedProxConfig:
    """FedProx's local objective F_k(w) + mu/2 ||w - w_t||^2 (Li et al. 2020)."""

    mu: Annotated[float, PROXIMAL] = 0.01  # the paper's grid: 0.001, 0.01, 0.1, 1


@dataclass(frozen=True)
class ScaffoldConfig:
    """SCAFFOLD's client control update (Karimireddy et al. 2020, Algorithm 1)."""

    option: Literal["I", "II"] = "II"  # I: full local gradient at x; II: from the steps
    # a regular expression on tensor names: only those entries get controls (the
    # upload's delta c_k shrinks to them); null: every entry
    controls: str | None = None

    def check(self) -> None:
        check_pattern("scaffold.controls", self.controls)


@dataclass(frozen=True)
class PerFedAvgConfig:
    """Per-FedAvg's local meta-update (Fallah et al. 2020; algorithms/perfedavg.py)."""

    variant: Literal["fo", "hf"] = "fo"  # fo: first order; hf: Hessian-free
    alpha: Annotated[float, Range(">= 0")] = 0.01  # inner step: w' = w - alpha grad f(w; D)
    # outer step; null: the run's lr (decayed by lr_decay like it)
    beta: Annotated[float | None, Range("> 0", null="the run's lr")] = None
    # tau: meta-steps per round, each on fresh batches D, D' (and D'')
    steps: Annotated[int, Range(">= 1", note="tau"), Most(MAX_STEPS, "meta-steps a round")] = 10
    hvp: Literal["exact", "finite_difference"] = "exact"  # hf: H(w; D'') v
    # finite_difference: (g(w + delta v) - g(w - delta v)) / (2 delta)
    delta: Annotated[float, Range("> 0")] = 1e-3

    def outer_lr(self, lr: float) -> float:
        """The outer step beta: its own, or the run's ``lr``."""
        return self.beta if self.beta is not None else lr


def check_pattern(field: str, pattern: str | None) -> None:
    """Refuse in one line a ``field`` that is not a Python regular expression."""
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as e:
            raise invalid_field(field, pattern, f"a Python regular expression ({e})") from None


ParamKindName = Literal["weight", "batchnorm", "buffer"]


@dataclass(frozen=True)
class LocalParamsConfig:
    """Entries of the model each client keeps for itself, never uploaded nor
    averaged, with any algorithm (algorithms/subsets.py): FedBN's local batch norm
    (Li et al. 2021) is ``kinds: [batchnorm, buffer]``; "share only batch norm" is
    ``kinds: [weight]``. An entry is local when its kind is in ``kinds`` or its
    name matches ``names``; neither set: every entry is shared."""

    # weight: plain parameters; batchnorm: normalisation layers' affine parameters;
    # buffer: running statistics
    kinds: tuple[ParamKindName, ...] = ()
    # a regular expression searched in each tensor's name (e.g. "^fc2\\."); null: none
    names: str | None = None

    def check(self) -> None:
        check_pattern("local_params.names", self.names)

    @property
    def any(self) -> bool:
        """Whether any entry is to stay local."""
        return bool(self.kinds) or self.names is not None

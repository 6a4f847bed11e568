"""The ``robust:`` config section: the aggregator, simulated attackers and the
gates against faulty and malicious clients (see fedforge.robust,
fedforge.robust.attacks, fedforge.robust.gates). The section checks its own
fields, with errors naming the field; how it combines with the rest of the run
(the cohort size, privacy) is checked in compat.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fedforge.core.errors import FieldCheck, raise_first

# mean, median, trimmed_mean, krum, multi_krum, bulyan, geometric_median,
# norm_bound, centred_clip or a plugin's: a registered name (core/registry.py)
AggregatorName = str
AttackName = Literal[
    "none", "label_flip", "sign_flip", "scaled", "gaussian", "alie", "ipm", "nan_inf", "uint8"
]


@dataclass(frozen=True)
class RobustConfig:
    """Byzantine robustness: the aggregator, simulated attackers, and the gates
    (see fedforge.robust, fedforge.robust.attacks, fedforge.robust.gates)."""

    aggregator: AggregatorName = "mean"  # mean: FedAvg's weighted mean
    byzantine: int = 0  # f assumed by krum, multi_krum, bulyan
    trim_fraction: float = 0.1  # trimmed_mean: beta, trimmed at each end
    multi_krum_m: int | None = None  # multi_krum: updates averaged; null = n - f
    norm_bound: float | None = None  # norm_bound/centred_clip: tau; null = median of recent norms
    norm_window: int = 5  # rounds of norms behind the adaptive bounds (and max_norm_multiple)
    centred_clip_iterations: int = 1
    geomed_max_iter: int = 100  # geometric_median: Weiszfeld steps at most
    geomed_tol: float = 1e-6  # ... until the objective improves by less (relative)
    attack: AttackName = "none"  # simulated attack of the attacker clients
    attack_fraction: float = 0.0  # attackers: round(fraction * num_clients), from the seed
    attack_scale: float = 10.0  # scaled: the factor
    attack_std: float = 1.0  # gaussian: the noise std
    alie_z: float | None = None  # alie: the shift in stds; null = Baruch et al.'s z_max
    ipm_epsilon: float = 0.5  # ipm: attackers send -epsilon * honest mean
    norm_gate: float | None = None  # robust z-score above which a norm is refused; null = off
    # fewer accepted updates: the round is skipped; null: 2 (1 when the cohort is
    # one client), so that one update never replaces the model (min_clients_of)
    min_clients: int | None = None
    # this many skipped rounds in a row (the model unchanged, e.g. every update
    # non-finite after a divergence) stop the run; 0: never
    max_skipped_rounds: int = 20
    # a client weighs at most the example count it declared when it joined; a
    # declaration at most this multiple of the federation's median; null: uncapped
    # (in simulation the declarations are the partition's true sizes)
    max_weight_ratio: float | None = None
    # an update whose L2 norm passes this multiple of ||w|| + sqrt(P) (the global
    # model's norm plus that of a vector of ones) is refused as absurd; null: off
    max_update_ratio: float | None = 100.0
    # an update whose L2 norm passes this multiple of the median norm of the
    # updates taken in the last norm_window rounds (a round with none behind it:
    # of its own uploads) is refused; null: off (robust/typical_norm.py)
    max_norm_multiple: float | None = 10.0
    # more than this fraction of the updates asked for refused over the last
    # refused_window upload rounds (withheld ones aside) stops the run; null: never
    max_refused_fraction: float | None = 0.5
    refused_window: int = 10
    client_gate: bool = False  # clients withhold updates whose held-out loss rose
    holdout_fraction: float = 0.1  # client_gate: the held-out slice of each client

    def check(self) -> None:
        """The section's own fields, each error naming ``robust.<field>``."""
        _check(self)

    def min_clients_of(self, cohort: int) -> int:
        """The fewest accepted updates a round of a ``cohort``-client cohort
        applies: ``min_clients``, or by default 2, so that one client's update
        never replaces the model of a cohort of several (1 when the cohort is one
        client: every round is one update)."""
        return self.min_clients if self.min_clients is not None else min(2, cohort)


def _check(r: RobustConfig) -> None:
    checks: list[FieldCheck] = [
        ("byzantine", r.byzantine, r.byzantine >= 0, "must be an integer >= 0"),
        ("trim_fraction", r.trim_fraction, 0.0 <= r.trim_fraction < 0.5, "must be in [0, 0.5)"),
        (
            "multi_krum_m",
            r.multi_krum_m,
            r.multi_krum_m is None or r.multi_krum_m >= 1,
            "must be an integer >= 1, or null (n - f)",
        ),
        (
            "norm_bound",
            r.norm_bound,
            r.norm_bound is None or r.norm_bound > 0,
            "must be > 0, or null (the median of recent norms)",
        ),
        ("norm_window", r.norm_window, r.norm_window >= 1, "must be an integer >= 1"),
        (
            "centred_clip_iterations",
            r.centred_clip_iterations,
            r.centred_clip_iterations >= 1,
            "must be an integer >= 1",
        ),
        ("geomed_max_iter", r.geomed_max_iter, r.geomed_max_iter >= 1, "must be an integer >= 1"),
        ("geomed_tol", r.geomed_tol, r.geomed_tol > 0, "must be > 0"),
        (
            "attack_fraction",
            r.attack_fraction,
            0.0 <= r.attack_fraction <= 1.0,
            "must be in [0, 1]",
        ),
        ("attack_std", r.attack_std, r.attack_std > 0, "must be > 0"),
        ("attack_scale", r.attack_scale, math.isfinite(r.attack_scale), "must be a finite number"),
        (
            "alie_z",
            r.alie_z,
            r.alie_z is None or math.isfinite(r.alie_z),
            "must be a finite number, or null (Baruch et al.'s z_max)",
        ),
        ("ipm_epsilon", r.ipm_epsilon, r.ipm_epsilon > 0, "must be > 0"),
        (
            "norm_gate",
            r.norm_gate,
            r.norm_gate is None or r.norm_gate > 0,
            "must be > 0 (3.5 is Iglewicz and Hoaglin's), or null (off)",
        ),
        (
            "min_clients",
            r.min_clients,
            r.min_clients is None or r.min_clients >= 1,
            "must be an integer >= 1, or null (2, or 1 when the cohort is one client)",
        ),
        (
            "max_skipped_rounds",
            r.max_skipped_rounds,
            r.max_skipped_rounds >= 0,
            "must be an integer >= 0 (0: never stop on skipped rounds)",
        ),
        (
            "max_weight_ratio",
            r.max_weight_ratio,
            r.max_weight_ratio is None or 1.0 <= r.max_weight_ratio < math.inf,
            "must be a finite number >= 1 (a multiple of the median declared count), or null",
        ),
        (
            "max_update_ratio",
            r.max_update_ratio,
            r.max_update_ratio is None or 0.0 < r.max_update_ratio < math.inf,
            "must be a finite number > 0 (a multiple of ||w|| + sqrt(P)), or null (off)",
        ),
        (
            "max_norm_multiple",
            r.max_norm_multiple,
            r.max_norm_multiple is None or 1.0 <= r.max_norm_multiple < math.inf,
            "must be a finite number >= 1 (a multiple of the median recent update norm), "
            "or null (off)",
        ),
        (
            "max_refused_fraction",
            r.max_refused_fraction,
            r.max_refused_fraction is None or 0.0 < r.max_refused_fraction < 1.0,
            "must be in (0, 1), or null (never stop on refused updates)",
        ),
        ("refused_window", r.refused_window, r.refused_window >= 1, "must be an integer >= 1"),
        (
            "holdout_fraction",
            r.holdout_fraction,
            0.0 < r.holdout_fraction < 1.0,
            "must be in (0, 1)",
        ),
        (
            "attack_fraction",
            r.attack_fraction,
            r.attack != "none" or r.attack_fraction == 0.0,
            "must be 0 when attack is 'none' (name the attack the attackers run)",
        ),
    ]
    raise_first("robust.", checks)

"""The ``robust:`` config section: the aggregator, simulated attackers and the
gates against faulty and malicious clients (see fedforge.robust,
fedforge.robust.attacks, fedforge.robust.gates). The section checks its own
fields, with errors naming the field; how it combines with the rest of the run
(the cohort size, privacy) is checked in compat.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_CLIENTS, MAX_ROUNDS, MAX_STEPS
from fedforge.config.ranges import Most, Range
from fedforge.core.errors import FieldCheck, raise_first

# mean, median, trimmed_mean, krum, multi_krum, bulyan, geometric_median,
# norm_bound, centred_clip or a plugin's: a registered name (core/registry.py)
AggregatorName = str
AttackName = Literal[
    "none",
    "label_flip",
    "sign_flip",
    "scaled",
    "gaussian",
    "alie",
    "ipm",
    "nan_inf",
    "uint8",
    "uint8_values",
]


@dataclass(frozen=True)
class RobustConfig:
    """Byzantine robustness: the aggregator, simulated attackers, and the gates
    (see fedforge.robust, fedforge.robust.attacks, fedforge.robust.gates)."""

    aggregator: AggregatorName = "mean"  # mean: FedAvg's weighted mean
    byzantine: Annotated[int, Range(">= 0"), Most(MAX_CLIENTS, "clients")] = (
        0  # f assumed by krum, multi_krum, bulyan
    )
    # trimmed_mean: beta, trimmed at each end
    trim_fraction: Annotated[float, Range("[0, 0.5)")] = 0.1
    # multi_krum: updates averaged; null = n - f
    multi_krum_m: Annotated[
        int | None, Range(">= 1", null="n - f"), Most(MAX_CLIENTS, "clients")
    ] = None
    # norm_bound/centred_clip: tau; null = median of recent norms
    norm_bound: Annotated[float | None, Range("> 0", null="the median of recent norms")] = None
    # rounds of norms behind the adaptive bounds (and max_norm_multiple)
    norm_window: Annotated[int, Range(">= 1"), Most(MAX_ROUNDS, "rounds")] = 5
    centred_clip_iterations: Annotated[
        int, Range(">= 1"), Most(MAX_STEPS, "passes over the cohort's updates")
    ] = 1
    geomed_max_iter: Annotated[
        int, Range(">= 1"), Most(MAX_STEPS, "passes over the cohort's updates")
    ] = 100  # geometric_median: Weiszfeld steps
    # ... until the objective improves by less (relative)
    geomed_tol: Annotated[float, Range("> 0")] = 1e-6
    attack: AttackName = "none"  # simulated attack of the attacker clients
    # attackers: round(fraction * num_clients), from the seed
    attack_fraction: Annotated[float, Range("[0, 1]")] = 0.0
    # the chance an attacker misbehaves in a round (seeded per round and client):
    # below 1, a fault that comes and goes; 1: every round
    attack_probability: Annotated[float, Range("(0, 1]")] = 1.0
    attack_scale: float = 10.0  # scaled: the factor
    attack_std: Annotated[float, Range("> 0")] = 1.0  # gaussian: the noise std
    alie_z: float | None = None  # alie: the shift in stds; null = Baruch et al.'s z_max
    # ipm: attackers send -epsilon * honest mean
    ipm_epsilon: Annotated[float, Range("> 0")] = 0.5
    # robust z-score above which a norm is refused; null = off
    norm_gate: Annotated[
        float | None, Range("> 0", note="3.5 is Iglewicz and Hoaglin's", null="off")
    ] = None
    # fewer accepted updates: the round is skipped; null: 2 (1 when the cohort is
    # one client), so that one update never replaces the model (min_clients_of)
    min_clients: Annotated[
        int | None,
        Range(">= 1", null="2, or 1 when the cohort is one client"),
        Most(MAX_CLIENTS, "clients"),
    ] = None
    # this many skipped rounds in a row (the model unchanged, e.g. every update
    # non-finite after a divergence) stop the run; 0: never
    max_skipped_rounds: Annotated[
        int, Range(">= 0", note="0: never stop on skipped rounds"), Most(MAX_ROUNDS, "rounds")
    ] = 20
    # a client weighs at most the example count it declared when it joined; a
    # declaration at most this multiple of the federation's median; null: uncapped
    # (in simulation the declarations are the partition's true sizes)
    max_weight_ratio: Annotated[
        float | None, Range(">= 1", note="a multiple of the median declared count", null="")
    ] = None
    # an update whose L2 norm passes this multiple of ||w|| + sqrt(P) (the global
    # model's norm plus that of a vector of ones) is refused as absurd; null: off
    max_update_ratio: Annotated[
        float | None, Range("> 0", note="a multiple of ||w|| + sqrt(P)", null="off")
    ] = 100.0
    # an update whose L2 norm passes this multiple of the median norm of the
    # updates taken in the last norm_window rounds (a round with none behind it:
    # of its own uploads) is refused; null: off (robust/typical_norm.py)
    max_norm_multiple: Annotated[
        float | None,
        Range(">= 1", note="a multiple of the median recent update norm", null="off"),
    ] = 10.0
    # more than this fraction of the updates asked for refused over the last
    # refused_window upload rounds (withheld ones aside) stops the run; null: never
    max_refused_fraction: Annotated[
        float | None, Range("(0, 1)", null="never stop on refused updates")
    ] = 0.5
    refused_window: Annotated[int, Range(">= 1"), Most(MAX_ROUNDS, "rounds")] = 10
    client_gate: bool = False  # clients withhold updates whose held-out loss rose
    # client_gate: the held-out slice of each client
    holdout_fraction: Annotated[float, Range("(0, 1)")] = 0.1

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
        ("attack_scale", r.attack_scale, math.isfinite(r.attack_scale), "must be a finite number"),
        (
            "alie_z",
            r.alie_z,
            r.alie_z is None or math.isfinite(r.alie_z),
            "must be a finite number, or null (Baruch et al.'s z_max)",
        ),
        (
            "attack_fraction",
            r.attack_fraction,
            r.attack != "none" or r.attack_fraction == 0.0,
            "must be 0 when attack is 'none' (name the attack the attackers run)",
        ),
        (
            "attack_probability",
            r.attack_probability,
            r.attack_probability == 1.0 or r.attack != "label_flip",
            "must be 1 with attack 'label_flip' (a poisoned data set is poisoned every round)",
        ),
    ]
    raise_first("robust.", checks)

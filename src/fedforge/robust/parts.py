"""A run's robustness parts, assembled from ``cfg.robust``: the aggregator, the
simulated attackers (data poisoning, a last client stage, a faulty encoder, or
a colluding cohort stage), the server's norm gate and the client's gate.

Refuses at build time the aggregator the run's cohort size K = max(1, floor(C N))
is too small for (Krum/Multi-Krum with K < 2f + 3, Bulyan with K < 4f + 3: the
built aggregator's ``min_updates``); what the config alone rules out is refused
when it is checked (config/compat.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedforge import robust as agg
from fedforge.client.gate import ClientGate
from fedforge.client.runtime import ClientDataFn, TamperFn
from fedforge.communication.shared import memoryless
from fedforge.config import Config, RobustConfig
from fedforge.config.compat import describe_cohort
from fedforge.config.components import make
from fedforge.core.errors import ConfigError
from fedforge.pipeline.pipeline import Codec, CohortStage, Stage
from fedforge.robust.attacks import (
    Collusion,
    DeltaAttack,
    attacker_ids,
    flipped_labels_fn,
    uint8_tamper,
)
from fedforge.selection.sampling import cohort_size


def make_aggregator(cfg: Config) -> agg.Aggregator:
    """The aggregator ``robust.aggregator`` names, built by its registered factory."""
    aggregator: agg.Aggregator = make("aggregator", cfg.robust.aggregator, cfg, "robust.aggregator")
    return aggregator


@dataclass(frozen=True)
class RobustParts:
    """What ``build`` puts into the pipeline and the client runtime."""

    aggregator: agg.Aggregator
    client_stages: tuple[Stage, ...]  # the attacks: last, after clipping and noise
    cohort_stages: tuple[CohortStage, ...]
    data_fn: ClientDataFn  # what clients train on (poisoned, minus the held-out slice)
    gate: ClientGate | None
    tamper_fn: TamperFn | None
    attackers: frozenset[int]


def _check_cohort(
    aggregator: agg.Aggregator, robust: RobustConfig, num_clients: int, client_fraction: float
) -> None:
    """Refuse an aggregator that needs more updates than a cohort holds."""
    need = agg.min_updates(aggregator)
    if cohort_size(num_clients, client_fraction) < need:
        formula = "4f + 3" if robust.aggregator == "bulyan" else "2f + 3"
        raise ConfigError(
            f"robust.aggregator '{robust.aggregator}' with robust.byzantine f = "
            f"{robust.byzantine} needs n >= {formula} = {need} updates a round, but "
            f"{describe_cohort(num_clients, client_fraction)}; lower f or raise client_fraction"
        )


def assemble(
    cfg: Config, data_fn: ClientDataFn, uplink: Codec | None = None, num_classes: int = 10
) -> RobustParts:
    """The robustness parts of ``cfg``; raises ConfigError when the cohort is too small.
    ``uplink``: the update codec, which colluding attackers' rows go through too;
    ``num_classes``: the data's (label flipping maps class c to num_classes - 1 - c)."""
    r = cfg.robust
    aggregator = make_aggregator(cfg)
    _check_cohort(aggregator, r, cfg.num_clients, cfg.client_fraction)
    attackers = attacker_ids(cfg.num_clients, r.attack_fraction, cfg.seed)
    client: tuple[Stage, ...] = ()
    cohort: tuple[CohortStage, ...] = ()
    tamper: TamperFn | None = None
    if r.attack == "label_flip":
        data_fn = flipped_labels_fn(data_fn, attackers, num_classes)
    elif r.attack in ("sign_flip", "scaled", "gaussian", "nan_inf", "uint8_values"):
        kind = r.attack
        client = (DeltaAttack(kind, attackers, r.attack_scale, r.attack_std, r.attack_probability),)
    elif r.attack == "uint8":
        tamper = uint8_tamper(attackers, r.attack_probability)
    elif r.attack in ("alie", "ipm"):
        codec = None if uplink is None else memoryless(uplink)  # the attacker keeps no residual
        p = r.attack_probability
        cohort = (Collusion(r.attack, attackers, r.alie_z, r.ipm_epsilon, codec, p),)
    if r.norm_gate is not None:
        cohort = (*cohort, make("stage", "norm_gate", cfg))
    gate = None
    if r.client_gate:  # a Byzantine client does not gate itself
        gate = ClientGate(data_fn, r.holdout_fraction, cfg.seed, exempt=attackers)
    train_fn = gate.train_data if gate is not None else data_fn
    return RobustParts(aggregator, client, cohort, train_fn, gate, tamper, attackers)

"""The ``privacy:`` config section: differential privacy (central, local or
distributed), its accountant and budget, secure aggregation, and privacy tiers
(see fedforge.privacy.parts, fedforge.privacy.dp, fedforge.privacy.tiers,
fedforge.privacy.secagg). The section checks its own fields, with errors naming
the field; how it combines with the rest of the run is checked in compat.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fedforge.core.errors import ConfigError, FieldCheck, raise_first

DPMode = Literal["none", "central", "local", "distributed"]


@dataclass(frozen=True)
class TierConfig:
    """Privacy tiers: clients of the ``high`` sensitivity level get
    secure aggregation plus local DP, the others (``low``) secure aggregation only.
    The high tier is ``high_clients``, or ``round(high_fraction * num_clients)``
    clients drawn from the seed; neither set: no tiers."""

    high_fraction: float = 0.0
    high_clients: tuple[int, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.high_fraction > 0 or bool(self.high_clients)


@dataclass(frozen=True)
class PrivacyConfig:
    """What protects the clients' data beyond keeping it on the clients."""

    # central: noise on the server's sum; local: each client noises; distributed: each
    # client adds sigma / sqrt(n_min) before the secure-aggregation mask
    dp: DPMode = "none"
    noise_multiplier: float = 1.0  # z: noise std = z * clip_norm
    clip_norm: float = 1.0  # C: each delta clipped to this L2 norm (the initial C if adaptive)
    sampling: Literal["fixed", "poisson"] = "fixed"  # cohort: m = C N, or each client w.p. C
    weights: Literal["uniform", "capped"] = "uniform"  # central: min(n_k / weight_cap, 1)
    weight_cap: int | None = None  # capped: the num_examples that earns full weight
    adaptive_clip: bool = False  # Andrew et al. 2021: clip_norm follows a quantile
    target_quantile: float = 0.5  # gamma
    clip_lr: float = 0.2  # eta: C <- C exp(-eta (b - gamma))
    clip_count_std: float | None = None  # sigma_b of the clipped count; null = cohort / 20
    delta: float | None = None  # null: 1 / num_clients**1.1
    accountant: Literal["rdp", "pld"] = "rdp"  # pld needs poisson sampling
    target_epsilon: float | None = None  # stop before a round would spend more
    # noise seeded from the OS's CSPRNG, not derived from the run seed: whoever knows
    # the seed cannot subtract it, and the run no longer repeats bit for bit
    secret_noise: bool = False
    secagg: bool = False  # Bonawitz et al. 2017 secure aggregation of the updates
    secagg_threshold: float = 0.66  # t = ceil(threshold * cohort) shares reconstruct
    secagg_frac_bits: int = 20  # fixed point: x -> round(x 2^f) mod 2^k
    # SecAgg+ (Bell et al. 2020): each client masks with and shares among only k
    # neighbours of a random k-regular graph (t = ceil(threshold (k + 1)) of each
    # neighbourhood); null: every pair (SecAgg)
    secagg_neighbours: int | None = None
    # simulated dropouts: this fraction of the clients still in the protocol stops
    # answering before each phase (drawn from (seed, round, phase))
    secagg_drop_advertise: float = 0.0
    secagg_drop_share_keys: float = 0.0
    secagg_drop_masked_input: float = 0.0  # before sending its masked update
    secagg_drop_unmask: float = 0.0  # after its masked update arrived
    tiers: TierConfig = field(default_factory=TierConfig)  # high: + local DP; low: SecAgg only

    @property
    def hides_updates(self) -> bool:
        """Whether the server must not see a client's own numbers: local DP (noised
        on the client), secure aggregation, distributed DP and the tiers. Its
        training loss is then not reported either (a function of its data, exact);
        its example count still travels (the weights need it)."""
        return self.dp in ("local", "distributed") or self.secagg or self.tiers.enabled

    def check(self) -> None:
        """The section's own fields, each error naming ``privacy.<field>``."""
        _check(self)


def secagg_drops(p: PrivacyConfig) -> dict[str, float]:
    """The simulated dropout fraction before each secure-aggregation phase."""
    return {
        "advertise": p.secagg_drop_advertise,
        "share_keys": p.secagg_drop_share_keys,
        "masked_input": p.secagg_drop_masked_input,
        "unmask": p.secagg_drop_unmask,
    }


def delta_of(p: PrivacyConfig, num_clients: int) -> float:
    """The delta epsilon is reported at."""
    return p.delta if p.delta is not None else 1.0 / num_clients**1.1


def _check(p: PrivacyConfig) -> None:
    checks: list[FieldCheck] = [
        ("noise_multiplier", p.noise_multiplier, p.noise_multiplier >= 0, "must be >= 0"),
        ("clip_norm", p.clip_norm, p.clip_norm > 0, "must be > 0"),
        (
            "weight_cap",
            p.weight_cap,
            (p.weight_cap is None or p.weight_cap >= 1)
            and (p.weights != "capped" or p.weight_cap is not None),
            "must be an integer >= 1 (and is needed by weights = 'capped')",
        ),
        ("target_quantile", p.target_quantile, 0 < p.target_quantile < 1, "must be in (0, 1)"),
        ("clip_lr", p.clip_lr, p.clip_lr > 0, "must be > 0"),
        (
            "clip_count_std",
            p.clip_count_std,
            p.clip_count_std is None or p.clip_count_std > 0,
            "must be > 0, or null (cohort / 20)",
        ),
        (
            "delta",
            p.delta,
            p.delta is None or 0 < p.delta < 1,
            "must be in (0, 1) (well below 1 / num_clients), or null (1 / num_clients**1.1)",
        ),
        (
            "target_epsilon",
            p.target_epsilon,
            p.target_epsilon is None or p.target_epsilon > 0,
            "must be > 0, or null (no budget)",
        ),
        (
            "secagg_threshold",
            p.secagg_threshold,
            0.5 < p.secagg_threshold <= 1,
            "must be in (0.5, 1]: t > n/2 shares keep two disjoint halves from both unmasking",
        ),
        (
            "secagg_frac_bits",
            p.secagg_frac_bits,
            4 <= p.secagg_frac_bits <= 40,
            "must be an integer in 4..40",
        ),
        (
            "secagg_neighbours",
            p.secagg_neighbours,
            p.secagg_neighbours is None
            or (p.secagg_neighbours >= 2 and p.secagg_neighbours % 2 == 0 and p.secagg),
            "must be an even integer >= 2 (the Harary graph H(k, n): k/2 neighbours on "
            "either side of each client on a random ring) below the cohort size, with "
            "privacy.secagg = true; or null (every pair masks: SecAgg)",
        ),
        *(
            (f"secagg_drop_{phase}", v, 0 <= v < 1, "must be in [0, 1)")
            for phase, v in secagg_drops(p).items()
        ),
        (
            "adaptive_clip",
            p.adaptive_clip,
            not p.adaptive_clip or p.dp == "central",
            "needs dp = 'central' (the clipped count is noised on the server)",
        ),
        (
            "target_epsilon",
            p.target_epsilon,
            p.target_epsilon is None or p.dp != "none" or p.tiers.enabled,
            "needs dp = 'central', 'local' or 'distributed', or privacy tiers (without DP "
            "nothing is spent)",
        ),
        (
            "dp",
            p.dp,
            p.dp != "distributed" or p.secagg,
            "'distributed' needs privacy.secagg = true: each client adds only "
            "sigma / sqrt(n_min) of the noise, so only the masked sum of at least n_min "
            "updates carries the full noise (without masking the server would see every "
            "update almost unnoised); use dp = 'central' or 'local', or set secagg = true",
        ),
        (
            "weights",
            p.weights,
            p.dp != "distributed" or p.weights == "uniform",
            "must be 'uniform' with dp = 'distributed': secure aggregation sends w_k times "
            "the noised update, so a weight w_k < 1 would shrink that client's noise and the "
            "sum could carry less than the central noise",
        ),
        *_tier_checks(p),
    ]
    raise_first("privacy.", checks)
    if p.dp in ("central", "distributed", "local") and p.noise_multiplier == 0:
        raise ConfigError(
            f"config field 'privacy.noise_multiplier' = 0.0 is invalid with dp = '{p.dp}': "
            "no noise gives no privacy; use dp = 'none'"
        )


def _tier_checks(p: PrivacyConfig) -> list[FieldCheck]:
    t = p.tiers
    return [
        (
            "tiers.high_fraction",
            t.high_fraction,
            0 <= t.high_fraction <= 1,
            "must be in [0, 1] (the fraction of clients in the high tier)",
        ),
        (
            "tiers",
            {"high_fraction": t.high_fraction, "high_clients": list(t.high_clients)},
            not (t.high_fraction > 0 and t.high_clients),
            "set high_fraction (clients drawn from the seed) or high_clients (a list of "
            "client ids), not both",
        ),
        (
            "tiers.high_clients",
            list(t.high_clients),
            all(c >= 0 for c in t.high_clients) and len(set(t.high_clients)) == len(t.high_clients),
            "must be distinct client ids >= 0",
        ),
        (
            "tiers",
            {"high_fraction": t.high_fraction, "high_clients": list(t.high_clients)},
            not t.enabled or p.secagg,
            "tiers need privacy.secagg = true (high = SecAgg + local DP, low = SecAgg only)",
        ),
        (
            "dp",
            p.dp,
            not t.enabled or p.dp == "none",
            "must be 'none' with privacy.tiers: the tiers set each client's DP themselves "
            "(high: local DP with privacy.noise_multiplier and clip_norm; low: none)",
        ),
        (
            "noise_multiplier",
            p.noise_multiplier,
            not t.enabled or p.noise_multiplier > 0,
            "must be > 0 with privacy.tiers (the high tier's local DP noise is z C)",
        ),
    ]

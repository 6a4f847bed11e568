"""The ``privacy:`` config section: differential privacy (central, local or
distributed), its accountant and budget, secure aggregation, and privacy tiers
(see fedforge.privacy.parts, fedforge.privacy.dp, fedforge.privacy.tiers,
fedforge.privacy.secagg). The section checks its own fields, with errors naming
the field; how it combines with the rest of the run is checked in compat.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_CLIENTS, MAX_EXAMPLES
from fedforge.config.ranges import Most, Range
from fedforge.core.errors import ConfigError, FieldCheck, raise_first

DPMode = Literal["none", "central", "local", "distributed"]


@dataclass(frozen=True)
class TierConfig:
    """Privacy tiers: clients of the ``high`` sensitivity level get
    secure aggregation plus local DP, the others (``low``) secure aggregation only.
    The high tier is ``high_clients``, or ``round(high_fraction * num_clients)``
    clients drawn from the seed; neither set: no tiers."""

    high_fraction: Annotated[
        float, Range("[0, 1]", note="the fraction of clients in the high tier")
    ] = 0.0
    high_clients: Annotated[tuple[int, ...], Most(MAX_CLIENTS - 1, "client ids", least=0)] = ()

    @property
    def enabled(self) -> bool:
        return self.high_fraction > 0 or bool(self.high_clients)


@dataclass(frozen=True)
class PrivacyConfig:
    """What protects the clients' data beyond keeping it on the clients."""

    # central: noise on the server's sum; local: each client noises; distributed: each
    # client adds sigma / sqrt(n_min) before the secure-aggregation mask
    dp: DPMode = "none"
    noise_multiplier: Annotated[float, Range(">= 0")] = 1.0  # z: noise std = z * clip_norm
    # local DP: z calibrated so that one upload spends this epsilon at delta (the
    # accountant's calibrate_local_noise); null: noise_multiplier as given
    round_epsilon: Annotated[float | None, Range("> 0", null="noise_multiplier as given")] = None
    # C: each delta clipped to this L2 norm (the initial C if adaptive)
    clip_norm: Annotated[float, Range("> 0")] = 1.0
    sampling: Literal["fixed", "poisson"] = "fixed"  # cohort: m = C N, or each client w.p. C
    weights: Literal["uniform", "capped"] = "uniform"  # central: min(n_k / weight_cap, 1)
    weight_cap: Annotated[int | None, Most(MAX_EXAMPLES, "examples a client", least=1)] = (
        None  # capped: the num_examples that earns full weight
    )
    adaptive_clip: bool = False  # Andrew et al. 2021: clip_norm follows a quantile
    target_quantile: Annotated[float, Range("(0, 1)")] = 0.5  # gamma
    clip_lr: Annotated[float, Range("> 0")] = 0.2  # eta: C <- C exp(-eta (b - gamma))
    # sigma_b of the clipped count; null = cohort / 20
    clip_count_std: Annotated[float | None, Range("> 0", null="cohort / 20")] = None
    delta: Annotated[
        float | None,
        Range("(0, 1)", note="well below 1 / num_clients", null="1 / num_clients**1.1"),
    ] = None
    accountant: Literal["rdp", "pld"] = "rdp"  # pld needs poisson sampling
    # stop before a round would spend more
    target_epsilon: Annotated[float | None, Range("> 0", null="no budget")] = None
    # where the noise's randomness comes from. true: the OS's CSPRNG, which no seed
    # reveals (runs no longer repeat bit for bit); false: derived from the run seed,
    # so whoever knows the seed can draw the same noise and subtract it; null (the
    # default): false in a simulation (one party), true in `fedforge server` runs
    # (the server picks the seed and sends it to the clients)
    secret_noise: bool | None = None
    # `fedforge server` runs only: allow secret_noise false, stating that the
    # server may know the noise (it can recompute it); each client still draws its
    # own from the OS unless its operator joins with --trust-server-noise
    trusted_server_noise: bool = False
    secagg: bool = False  # Bonawitz et al. 2017 secure aggregation of the updates
    # t = ceil(threshold * cohort) shares reconstruct
    secagg_threshold: Annotated[
        float,
        Range("(0.5, 1]", note="t > n/2 shares keep two disjoint halves from both unmasking"),
    ] = 0.66
    # fixed point: x -> round(x 2^f) mod 2^k
    secagg_frac_bits: Annotated[int, Range("[4, 40]"), Most(40, "fixed-point bits")] = 20
    # SecAgg+ (Bell et al. 2020): each client masks with and shares among only k
    # neighbours of a random k-regular graph (t = ceil(threshold (k + 1)) of each
    # neighbourhood); null: every pair (SecAgg)
    secagg_neighbours: Annotated[int | None, Most(MAX_CLIENTS, "clients", least=2)] = None
    # simulated dropouts: this fraction of the clients still in the protocol stops
    # answering before each phase (drawn from (seed, round, phase))
    secagg_drop_advertise: Annotated[float, Range("[0, 1)")] = 0.0
    secagg_drop_share_keys: Annotated[float, Range("[0, 1)")] = 0.0
    # before sending its masked update
    secagg_drop_masked_input: Annotated[float, Range("[0, 1)")] = 0.0
    secagg_drop_unmask: Annotated[float, Range("[0, 1)")] = 0.0  # after its masked update arrived
    tiers: TierConfig = field(default_factory=TierConfig)  # high: + local DP; low: SecAgg only

    @property
    def hides_updates(self) -> bool:
        """Whether the server must not see a client's own numbers: local DP (noised
        on the client), secure aggregation, distributed DP and the tiers. Its
        training loss is then not reported either (a function of its data, exact);
        its example count still travels (the weights need it)."""
        return self.dp in ("local", "distributed") or self.secagg or self.tiers.enabled

    @property
    def noise_is_secret(self) -> bool:
        """Whether the noise comes from the OS: ``secret_noise`` true (a
        ``fedforge server`` run has turned its null into true by then)."""
        return self.secret_noise is True

    def check(self) -> None:
        """The section's own fields, each error naming ``privacy.<field>``."""
        _check(self)


def noised(p: PrivacyConfig) -> bool:
    """Whether the run draws privacy noise (DP of any kind, or the tiers' local DP)."""
    return p.dp != "none" or p.tiers.enabled


def _who_recomputes(p: PrivacyConfig) -> str:
    """Who knows the seed and sees the noised numbers, so can subtract the noise."""
    if p.dp == "central":
        return "every client, sent the seed with the config, can recompute the server's noise"
    return "the server can recompute the clients' noise"


def served_privacy(p: PrivacyConfig) -> PrivacyConfig:
    """The section as ``fedforge server`` runs it: the noise comes from the OS
    unless the config asks for seed-derived noise in so many words (which
    :func:`check_served_noise` allows only with ``trusted_server_noise``)."""
    return replace(p, secret_noise=True) if p.secret_noise is None else p


def check_served_noise(p: PrivacyConfig) -> None:
    """Refuse seed-derived noise in a ``fedforge server`` run unless the config
    says the server is trusted with it: the server picks the seed and sends it
    to every client in Hello."""
    if noised(p) and p.secret_noise is not True and not p.trusted_server_noise:
        what = f"privacy.dp = '{p.dp}'" if p.dp != "none" else "privacy tiers"
        raise ConfigError(
            f"config field 'privacy.secret_noise' = {p.secret_noise} is refused by "
            f"`fedforge server` with {what}: the noise would be derived from the run "
            f"seed, which the server picks and sends to every client, so "
            f"{_who_recomputes(p)} and subtract it; leave secret_noise out (the OS's "
            "randomness, the default here) or set privacy.trusted_server_noise: true"
        )


def served_noise_warning(p: PrivacyConfig) -> str | None:
    """The line a ``fedforge server`` run says at start when its noise is derived
    from the run seed: allowed by ``trusted_server_noise``, or a resumed run's
    stored config (a simulation's, or an older server's); None when it is not."""
    if not noised(p) or p.secret_noise is True:
        return None
    why = (
        "privacy.trusted_server_noise"
        if p.trusted_server_noise
        else f"the run's stored config (privacy.secret_noise = {p.secret_noise})"
    )
    return (
        f"{why}: the privacy noise is derived from the run seed: {_who_recomputes(p)} "
        "and subtract it (a client draws its own noise from the OS unless it joined "
        "with --trust-server-noise)"
    )


def client_privacy(p: PrivacyConfig, trust_server: bool) -> tuple[PrivacyConfig, str | None]:
    """The section as a deployment's client runs it, and the line it says when
    it overrides the server. Its noise hides its update from the server, which
    knows the run seed, so it draws the noise from the OS whatever the server's
    config says, unless its own operator trusts the server (``trust_server``:
    ``fedforge client --trust-server-noise``) and the server asked for
    seed-derived noise (``secret_noise: false``)."""
    if trust_server and p.secret_noise is False:
        return p, None
    said = None
    if p.secret_noise is False and noised(p):
        said = (
            "the server asked for privacy noise derived from the run seed "
            "(privacy.secret_noise: false), which the server knows and could subtract; "
            "this client draws its noise from the OS instead (--trust-server-noise "
            "follows the server)"
        )
    return replace(p, secret_noise=True), said


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
        (
            "weight_cap",
            p.weight_cap,
            (p.weight_cap is None or p.weight_cap >= 1)
            and (p.weights != "capped" or p.weight_cap is not None),
            "must be an integer >= 1 (and is needed by weights = 'capped')",
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
        (
            "adaptive_clip",
            p.adaptive_clip,
            not p.adaptive_clip or p.dp == "central",
            "needs dp = 'central' (the clipped count is noised on the server)",
        ),
        (
            "round_epsilon",
            p.round_epsilon,
            p.round_epsilon is None or p.dp == "local",
            "needs dp = 'local' (a per-upload budget: the noise each client adds); "
            "central and distributed DP set noise_multiplier or target_epsilon",
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

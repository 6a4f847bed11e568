"""A run's privacy parts, assembled from ``cfg.privacy``: the clipping and noise
stages of central, local or distributed DP (``dp.py``) and of privacy
tiers (``tiers.py``), the fixed-denominator mean, adaptive clipping's
server state, the accountant (``accountant.py``) and secure aggregation
(``secagg.py``, ``secagg_codec.py``).

Server state that must survive a resume (the adaptive clip norm) lives in
``LoopState.privacy`` and is checkpointed; epsilon is a pure function of the
rounds done. Distributed DP is accounted as central DP with the same noise
multiplier (its sums carry at least that noise). What the config alone rules
out (DP noise calibrated for a sum needs the mean aggregator; one clip norm,
not two; what secure aggregation cannot hide) is refused when the config is
checked (config/compat.py); refused here is what needs the built parts: an
algorithm sending tensors beside the delta, a budget spent by the first round.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedforge.algorithms.base import Algorithm
from fedforge.config import Config, PrivacyConfig
from fedforge.config.privacy import delta_of
from fedforge.core.errors import ConfigError
from fedforge.core.rng import noise_generator
from fedforge.pipeline.clip import Clip, ClipBoard
from fedforge.pipeline.pipeline import Stage
from fedforge.privacy.accountant import Accountant, calibrate_local_noise, local_epsilon
from fedforge.privacy.dp import (
    CentralNoise,
    DistributedNoise,
    DPMean,
    LocalNoise,
    expected_weight,
    next_clip_norm,
    update_noise_multiplier,
)
from fedforge.privacy.tiers import TieredNoise, high_tier
from fedforge.selection.periods import upload_period
from fedforge.selection.sampling import cohort_size

if TYPE_CHECKING:  # the codec imports ``cryptography`` (0.1 s): only runs that mask pay it
    from fedforge.privacy.secagg_codec import SecAggCodec, SecAggMean


@dataclass
class PrivacyParts:
    """What ``build`` puts into the pipeline, and the privacy side of the loop."""

    cfg: Config
    client_stages: tuple[Stage, ...]
    aggregate_stages: tuple[Stage, ...]
    aggregator: DPMean | None  # central DP: the fixed-denominator mean
    accountant: Accountant | None  # central DP: epsilon after t rounds
    board: ClipBoard | None  # adaptive clipping's messages
    expected_cohort: float
    count_std: float
    secagg: SecAggCodec | None = None  # secure aggregation: the masking codec
    secagg_mean: SecAggMean | None = None  # ... and its mean when there is no central DP
    high_tier: frozenset[int] | None = None  # privacy tiers: the high tier's clients

    # ------------------------------------------------------------ round hooks
    def initial_state(self) -> dict[str, Any]:
        """The server's privacy state before round 0 (checkpointed)."""
        return {"clip_norm": self.cfg.privacy.clip_norm} if self.board is not None else {}

    def begin_round(self, state: dict[str, Any], round_idx: int) -> None:
        """Publish the round's clip norm (with the payload)."""
        if self.board is not None:
            self.board.norms[round_idx] = float(state["clip_norm"])

    def end_round(self, state: dict[str, Any], round_idx: int, clients: Iterable[int]) -> None:
        """Adaptive clipping: the next clip norm from the noisy unclipped count of
        the clients whose updates were aggregated."""
        if self.board is None:
            return
        clients = list(clients)
        bits = sum(self.board.unclipped.pop((round_idx, c), 0) for c in clients)
        for key in [k for k in self.board.unclipped if k[0] <= round_idx]:
            del self.board.unclipped[key]  # refused or dropped clients' bits
        self.board.norms.pop(round_idx, None)
        p = self.cfg.privacy
        gen = noise_generator(p.noise_is_secret, self.cfg.seed, "clip_count", round_idx)
        counted = list(clients)
        state["clip_norm"] = next_clip_norm(
            float(state["clip_norm"]),
            bits,
            len(counted),
            self.expected_cohort,
            self.count_std,
            p.target_quantile,
            p.clip_lr,
            gen,
        )

    # ------------------------------------------------------------- reporting
    def _periods(self, rounds: int) -> list[tuple[int, int]]:
        """(first round, upload round) of the upload periods that release among the
        first ``rounds`` rounds."""
        k = self.cfg.communication.upload_every
        horizon = max(rounds, self.cfg.rounds)  # past the run's end: whole periods
        ends = (upload_period(r, k, horizon) for r in range(rounds))
        return [(start, end) for r, (start, end) in enumerate(ends) if r == end]

    def releases(self, rounds: int) -> list[int]:
        """The noised releases among the first ``rounds`` rounds, by the first round
        of their period: every round, or with ``upload_every`` = k one a period
        (its cohort sampled at the period's first round, its upload at the last)."""
        return [start for start, _ in self._periods(rounds)]

    def record_participation(
        self, state: dict[str, Any], round_idx: int, start: int, spent: bool, uploaded: list[int]
    ) -> None:
        """What upload round ``round_idx`` (period from ``start``) really cost, kept in
        the checkpointed ``state``. ``spent`` False: no upload reached the server
        (every sampled client dropped out), so no noise was drawn and nothing about
        anyone's data was seen; a round skipped for what its uploads held (all
        refused, too few valid) is spent like a released one, as its skip tells of
        them. ``uploaded``: the clients whose updates the server saw."""
        if not spent:
            state.setdefault("withheld", []).append(start)
        state.setdefault("since", round_idx)  # a checkpoint of older code starts later
        uploads = state.setdefault("uploads", {})
        for c in uploaded:
            uploads[str(c)] = uploads.get(str(c), 0) + 1
        state["through"] = round_idx + 1

    def epsilon(self, rounds: int, state: dict[str, Any] | None = None) -> float | None:
        """Central DP: epsilon after ``rounds`` rounds (their releases); local DP:
        the largest client epsilon; None without DP. ``state``: the participation
        the rounds recorded so far really had (:meth:`record_participation`); rounds
        past it are counted as planned (every release, every sampled client)."""
        if self.accountant is not None:
            withheld = set(state.get("withheld", ())) if state else set()
            spent = [t for t in self.releases(rounds) if t not in withheld]
            return self.accountant.epsilon(len(spent))
        if self.cfg.privacy.dp == "local" or self.high_tier is not None:
            eps = self.local_epsilons(rounds, state)
            return max(eps.values()) if eps else 0.0
        return None

    @property
    def delta(self) -> float:
        return delta_of(self.cfg.privacy, self.cfg.num_clients)

    @property
    def noise_multiplier(self) -> float:
        """The z the run's noise is drawn with: ``noise_multiplier``, or under local
        DP with ``round_epsilon`` the z calibrated to that per-upload budget."""
        return local_noise_multiplier(self.cfg.privacy, self.delta)

    def local_epsilons(self, rounds: int, state: dict[str, Any] | None = None) -> dict[int, float]:
        """Local DP: each client's epsilon after ``rounds`` rounds, one Gaussian
        mechanism per upload the server saw (from ``state``'s recorded uploads, and
        past them, for planning, each cohort a client is sampled into); under tiers,
        each high-tier client's; under distributed DP, each client's against the
        server (the noise on the sum is a local mechanism's, z C, and the server
        knows the cohort)."""
        from fedforge.selection.sampling import sample_cohort

        cfg, p = self.cfg, self.cfg.privacy
        since, through = (int(state.get(k, 0)) for k in ("since", "through")) if state else (0, 0)
        counts: dict[int, int] = {}
        if state:
            for c, k in state.get("uploads", {}).items():
                counts[int(c)] = int(k)
        poisson = p.sampling == "poisson"
        for start, end in self._periods(rounds):
            if since <= end < through:  # recorded: its real uploads are counted above
                continue
            for c in sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, start, poisson):
                counts[c] = counts.get(c, 0) + 1
        if self.high_tier is not None:
            counts = {c: k for c, k in counts.items() if c in self.high_tier}
        cache: dict[int, float] = {}
        for k in set(counts.values()):
            cache[k] = local_epsilon(self.noise_multiplier, k, self.delta, p.accountant)
        return {c: cache[k] for c, k in sorted(counts.items())}

    def summary(self, rounds: int, state: dict[str, Any] | None = None) -> dict[str, Any]:
        """The privacy lines of a run summary (``state``: the participation recorded)."""
        p = self.cfg.privacy
        out: dict[str, Any] = {"dp": p.dp, "secagg": p.secagg}
        if p.secagg_neighbours is not None:
            out["secagg_neighbours"] = p.secagg_neighbours
        if self.high_tier is not None:
            return {**out, **self._tier_summary(rounds, state)}
        if p.dp == "none":
            return out
        out.update(
            epsilon=self.epsilon(rounds, state),
            delta=self.delta,
            noise_multiplier=self.noise_multiplier,
            accountant=p.accountant,
        )
        if p.dp == "local":
            if p.round_epsilon is not None:
                out["round_epsilon"] = p.round_epsilon
            eps = self.local_epsilons(rounds, state)
            vals = sorted(eps.values())
            out["local_epsilon_median"] = vals[len(vals) // 2] if vals else 0.0
            out["local_epsilon"] = {str(c): e for c, e in eps.items()}
        if p.dp == "distributed" and self.secagg is not None:
            n_min = self.secagg.min_survivors
            server = self.local_epsilons(rounds, state)  # the server knows the cohorts
            out.update(
                min_survivors=n_min,
                client_noise_std=p.noise_multiplier * p.clip_norm / n_min**0.5,
                epsilon_vs_server=max(server.values()) if server else 0.0,
                accounting="epsilon: central Gaussian, same noise multiplier, against "
                "those who see the models (sampling amplifies; exact with n_min inputs in "
                "a sum, conservative with more); epsilon_vs_server: against the server, "
                "which knows whom it sampled (no amplification: the worst client's "
                "participations composed); clients colluding with it remove their shares",
            )
        return out

    def _tier_summary(self, rounds: int, state: dict[str, Any] | None) -> dict[str, Any]:
        """What each tier got, and the high tier's local epsilons."""
        p, high = self.cfg.privacy, self.high_tier or frozenset()
        eps = self.local_epsilons(rounds, state)
        vals = sorted(eps.values())
        z, clip = p.noise_multiplier, p.clip_norm
        tiers = {
            "high": {
                "clients": len(high),
                "applied": f"clip {clip:g} + local DP (noise std {z * clip:g}) + secure "
                "aggregation",
                "local_epsilon_max": vals[-1] if vals else 0.0,
                "local_epsilon_median": vals[len(vals) // 2] if vals else 0.0,
            },
            "low": {
                "clients": self.cfg.num_clients - len(high),
                "applied": f"clip {clip:g} + secure aggregation (no DP noise: no epsilon)",
            },
        }
        return {
            "tiers": tiers,
            "high_clients": sorted(high),
            "epsilon": vals[-1] if vals else 0.0,  # the high tier's worst client
            "delta": self.delta,
            "noise_multiplier": z,
            "accountant": p.accountant,
            "local_epsilon": {str(c): e for c, e in eps.items()},
        }


def assemble(cfg: Config, num_examples: list[int]) -> PrivacyParts:
    """The privacy parts of ``cfg``; raises ConfigError when the first round would
    spend more than ``privacy.target_epsilon`` or adaptive clipping cannot be noised."""
    p = cfg.privacy
    m = cohort_size(cfg.num_clients, cfg.client_fraction)
    q = cfg.client_fraction if p.sampling == "poisson" else m / cfg.num_clients
    expected = q * cfg.num_clients
    count_std = p.clip_count_std if p.clip_count_std is not None else expected / 20
    parts = PrivacyParts(cfg, (), (), None, None, None, expected, count_std)
    if p.secagg:
        _secagg(parts, cfg, m, num_examples)
    if p.dp == "none" and not p.tiers.enabled:
        return parts
    board = ClipBoard() if p.adaptive_clip else None
    clip = Clip(p.clip_norm, board)
    if p.tiers.enabled:  # high: clip + local noise; low: clip; both masked
        t = p.tiers
        parts.high_tier = high_tier(cfg.num_clients, t.high_fraction, t.high_clients, cfg.seed)
        noise = TieredNoise(p.noise_multiplier, p.clip_norm, parts.high_tier, p.noise_is_secret)
        parts.client_stages = (clip, noise)
        _check_budget(parts)
        return parts
    if p.dp == "local":
        z = parts.noise_multiplier
        parts.client_stages = (clip, LocalNoise(z, p.clip_norm, p.noise_is_secret))
        _check_budget(parts)
        return parts
    z = p.noise_multiplier
    if p.adaptive_clip:
        try:
            z = update_noise_multiplier(p.noise_multiplier, count_std)
        except ValueError as exc:
            raise ConfigError(f"privacy.adaptive_clip: {exc}") from None
    cap = p.weight_cap if p.weights == "capped" else None
    denominator = expected_weight(num_examples, q, cap)
    parts.aggregator = DPMean(denominator, cap)
    if p.dp == "distributed":  # the noise is the clients' (secagg is required)
        n_min = parts.secagg.min_survivors if parts.secagg is not None else 1
        parts.client_stages = (clip, DistributedNoise(z, p.clip_norm, n_min, p.noise_is_secret))
    else:
        parts.client_stages = (clip,)
        parts.aggregate_stages = (CentralNoise(z, p.clip_norm, denominator, p.noise_is_secret),)
    parts.accountant = Accountant(
        p.noise_multiplier,
        cfg.num_clients,
        m,
        delta_of(p, cfg.num_clients),
        p.accountant,
        p.sampling,
        q if p.sampling == "poisson" else None,
    )
    parts.board = board
    _check_budget(parts)
    return parts


def local_noise_multiplier(p: PrivacyConfig, delta: float) -> float:
    """Local DP's z: calibrated so that one upload spends ``round_epsilon`` at
    ``delta`` with the run's accountant, or ``noise_multiplier`` as given."""
    if p.dp == "local" and p.round_epsilon is not None:
        return calibrate_local_noise(p.round_epsilon, delta, p.accountant)
    return p.noise_multiplier


def _secagg(parts: PrivacyParts, cfg: Config, m: int, num_examples: list[int]) -> None:
    """The masking codec of ``privacy.secagg`` (what it cannot hide is refused by
    the config's checks: config/compat.py)."""
    from fedforge.privacy.secagg_codec import SecAggCodec, SecAggMean, min_survivors, noise_bound

    p, comm = cfg.privacy, cfg.communication
    clipped = p.dp != "none" or p.tiers.enabled
    clip = p.clip_norm if clipped else float(comm.clip_norm or 0.0)
    # noise before the mask: each coordinate clamped at C + 8 s (secagg_codec.NOISE_TAIL)
    n_min = min_survivors(p.secagg_threshold, m) if p.dp == "distributed" else 1
    noise_std = 0.0  # central DP noises the unmasked sum
    if p.dp == "distributed":
        noise_std = p.noise_multiplier * clip / n_min**0.5
    elif p.dp == "local" or p.tiers.enabled:  # (the high tier's) local noise
        noise_std = local_noise_multiplier(p, delta_of(p, cfg.num_clients)) * clip
    bound = noise_bound(clip, noise_std)
    cohort_max = cfg.num_clients if p.sampling == "poisson" else m
    cap = p.weight_cap if p.weights == "capped" else None
    parts.secagg = SecAggCodec(
        bound,
        cohort_max,
        p.secagg_frac_bits,
        p.secagg_threshold,
        num_examples,
        cap,
        n_min,
        p.secagg_neighbours,
        cfg.seed,
    )
    if cfg.robust.aggregator == "mean":  # others: refused by the codec's ShowsOnlySum constraint
        parts.secagg_mean = SecAggMean(cap)


def check_algorithm(privacy: PrivacyConfig, algorithm: Algorithm) -> None:
    """Refuse privacy with an algorithm whose updates carry tensors beside the
    delta (SCAFFOLD's control deltas): they are neither masked, clipped nor noised,
    and each is the client's raw update rescaled."""
    server, p = algorithm.server, privacy
    if server is None or not server.update_tensors:
        return
    named = {
        "privacy.secagg": p.secagg,
        f"privacy.dp = '{p.dp}'": p.dp != "none",
        "privacy.tiers": p.tiers.enabled,
    }
    what = next((name for name, on in named.items() if on), None)
    if what is not None:
        raise ConfigError(
            f"{what}: algorithm '{algorithm.name}' sends {', '.join(server.update_tensors)} "
            "beside each delta, unmasked, unclipped and without noise (the client's raw update, "
            "rescaled): the server would see it; use fedavg or fedprox"
        )


def _check_budget(parts: PrivacyParts) -> None:
    """Refuse to start when even one round would exceed ``target_epsilon``."""
    cfg = parts.cfg
    target = cfg.privacy.target_epsilon
    first_upload = upload_period(0, cfg.communication.upload_every, cfg.rounds)[1]
    first = parts.epsilon(first_upload + 1)
    if target is not None and first is not None and first > target:
        raise ConfigError(
            f"privacy.target_epsilon = {target} is spent by the first round already "
            f"(epsilon {first:.3f} at delta {parts.delta:.3g}); raise noise_multiplier "
            "(fedforge.privacy.accountant.calibrate_noise finds one) or the budget"
        )


def noise_std_on_sum(parts: PrivacyParts, state: dict[str, Any]) -> float:
    """The central noise std on the sum this round (for reports and tests)."""
    stage = parts.aggregate_stages[0]
    assert isinstance(stage, CentralNoise)
    clip = float(state.get("clip_norm", stage.clip_norm))
    return stage.noise_multiplier * clip


__all__ = ["PrivacyParts", "assemble", "local_noise_multiplier", "noise_std_on_sum"]

"""A run's privacy parts, assembled from ``cfg.privacy``: the clipping and noise
stages of central or local DP (``stages/dp.py``), the fixed-denominator mean,
adaptive clipping's server state, the accountant (``accountant.py``) and secure
aggregation (``stages/secagg.py``).

Server state that must survive a resume (the adaptive clip norm) lives in
``LoopState.privacy`` and is checkpointed; epsilon is a pure function of the
rounds done. Refuses at build time what cannot work (DP noise calibrated for a
sum needs the mean aggregator; one clip norm, not two).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fedforge.accountant import Accountant, local_epsilon
from fedforge.algorithms.base import Algorithm
from fedforge.config import Config
from fedforge.config.privacy import delta_of
from fedforge.errors import ConfigError
from fedforge.pipeline import RULES, Pipeline, Stage
from fedforge.rng import torch_generator
from fedforge.server.sampling import cohort_size
from fedforge.stages.clip import Clip, ClipBoard
from fedforge.stages.dp import (
    CentralNoise,
    DPMean,
    LocalNoise,
    expected_weight,
    next_clip_norm,
    update_noise_multiplier,
)
from fedforge.stages.secagg_codec import LOCAL_DP_TAIL, SecAggCodec, SecAggMean


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
        bits = sum(self.board.unclipped.pop((round_idx, c), 0) for c in clients)
        for key in [k for k in self.board.unclipped if k[0] <= round_idx]:
            del self.board.unclipped[key]  # refused or dropped clients' bits
        self.board.norms.pop(round_idx, None)
        p = self.cfg.privacy
        gen = torch_generator(self.cfg.seed, "clip_count", round_idx)
        state["clip_norm"] = next_clip_norm(
            float(state["clip_norm"]),
            bits,
            self.expected_cohort,
            self.count_std,
            p.target_quantile,
            p.clip_lr,
            gen,
        )

    # ------------------------------------------------------------- reporting
    def epsilon(self, rounds: int) -> float | None:
        """Central DP: epsilon after ``rounds`` rounds; local DP: the largest
        client epsilon; None without DP."""
        if self.accountant is not None:
            return self.accountant.epsilon(rounds)
        if self.cfg.privacy.dp == "local":
            eps = self.local_epsilons(rounds)
            return max(eps.values()) if eps else 0.0
        return None

    @property
    def delta(self) -> float:
        return delta_of(self.cfg.privacy, self.cfg.num_clients)

    def local_epsilons(self, rounds: int) -> dict[int, float]:
        """Local DP: each client's epsilon after ``rounds`` rounds (from the cohorts
        it was sampled into: an upper bound on its uploads)."""
        from fedforge.server.sampling import sample_cohort

        cfg, p = self.cfg, self.cfg.privacy
        counts: dict[int, int] = {}
        for t in range(rounds):
            poisson = p.sampling == "poisson"
            for c in sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, t, poisson):
                counts[c] = counts.get(c, 0) + 1
        cache: dict[int, float] = {}
        for k in set(counts.values()):
            cache[k] = local_epsilon(p.noise_multiplier, k, self.delta, p.accountant)
        return {c: cache[k] for c, k in sorted(counts.items())}

    def summary(self, rounds: int) -> dict[str, Any]:
        """The privacy lines of a run summary."""
        p = self.cfg.privacy
        out: dict[str, Any] = {"dp": p.dp, "secagg": p.secagg}
        if p.dp == "none":
            return out
        out.update(
            epsilon=self.epsilon(rounds),
            delta=self.delta,
            noise_multiplier=p.noise_multiplier,
            accountant=p.accountant,
        )
        if p.dp == "local":
            eps = self.local_epsilons(rounds)
            vals = sorted(eps.values())
            out["local_epsilon_median"] = vals[len(vals) // 2] if vals else 0.0
            out["local_epsilon"] = {str(c): e for c, e in eps.items()}
        return out


def assemble(cfg: Config, num_examples: list[int]) -> PrivacyParts:
    """The privacy parts of ``cfg``; raises ConfigError on impossible combinations."""
    p = cfg.privacy
    m = cohort_size(cfg.num_clients, cfg.client_fraction)
    q = cfg.client_fraction if p.sampling == "poisson" else m / cfg.num_clients
    expected = q * cfg.num_clients
    count_std = p.clip_count_std if p.clip_count_std is not None else expected / 20
    parts = PrivacyParts(cfg, (), (), None, None, None, expected, count_std)
    if p.secagg:
        _secagg(parts, cfg, m, num_examples)
    if p.dp == "none":
        return parts
    if cfg.communication.clip_norm is not None:
        raise ConfigError(
            f"communication.clip_norm = {cfg.communication.clip_norm} and privacy.dp = "
            f"'{p.dp}' both clip; DP clips with privacy.clip_norm: set communication.clip_norm "
            "to null"
        )
    board = ClipBoard() if p.adaptive_clip else None
    clip = Clip(p.clip_norm, board)
    if p.dp == "local":
        parts.client_stages = (clip, LocalNoise(p.noise_multiplier, p.clip_norm))
        _check_budget(parts)
        return parts
    if cfg.robust.aggregator != "mean":
        raise ConfigError(
            f"privacy.dp = 'central' adds noise calibrated to a sum, but robust.aggregator = "
            f"'{cfg.robust.aggregator}' is not one: use robust.aggregator = mean"
        )
    z = p.noise_multiplier
    if p.adaptive_clip:
        try:
            z = update_noise_multiplier(p.noise_multiplier, count_std)
        except ValueError as exc:
            raise ConfigError(f"privacy.adaptive_clip: {exc}") from None
    cap = p.weight_cap if p.weights == "capped" else None
    denominator = expected_weight(num_examples, q, cap)
    parts.client_stages = (clip,)
    parts.aggregator = DPMean(denominator, cap)
    parts.aggregate_stages = (CentralNoise(z, p.clip_norm, denominator),)
    parts.accountant = Accountant(
        p.noise_multiplier,
        cfg.num_clients,
        m,
        delta_of(p, cfg.num_clients),
        p.accountant,
        p.sampling,
    )
    parts.board = board
    _check_budget(parts)
    return parts


def _secagg(parts: PrivacyParts, cfg: Config, m: int, num_examples: list[int]) -> None:
    """The masking codec of ``privacy.secagg``; refuses what it cannot hide."""
    p, comm = cfg.privacy, cfg.communication
    refusals = [
        (
            p.adaptive_clip,
            "privacy.adaptive_clip sends each client's unclipped bit in the clear beside "
            "its masked update; set adaptive_clip to false",
        ),
        (
            comm.uplink != "dense" or comm.error_feedback,
            f"communication.uplink = '{comm.uplink}' (error_feedback = {comm.error_feedback}) "
            "is a codec of its own; the masked update is the uplink: use uplink = dense "
            "without error feedback",
        ),
        (
            comm.groups > 0,
            f"communication.groups = {comm.groups}: an edge would average individual "
            "updates it cannot see; set groups to 0",
        ),
        (
            p.dp == "none" and comm.clip_norm is None,
            "the modulus is sized from a bound on each update: set privacy.dp (its "
            "clip_norm) or communication.clip_norm",
        ),
    ]
    for bad, why in refusals:
        if bad:
            raise ConfigError(f"privacy.secagg: {why}")
    clip = p.clip_norm if p.dp != "none" else float(comm.clip_norm or 0.0)
    bound = clip * (1 + LOCAL_DP_TAIL * p.noise_multiplier) if p.dp == "local" else clip
    cohort_max = cfg.num_clients if p.sampling == "poisson" else m
    cap = p.weight_cap if p.weights == "capped" else None
    parts.secagg = SecAggCodec(
        bound, cohort_max, p.secagg_frac_bits, p.secagg_threshold, num_examples, cap
    )
    if cfg.robust.aggregator == "mean":  # others are refused by the pipeline's rule
        parts.secagg_mean = SecAggMean(cap)


def check_algorithm(cfg: Config, algorithm: Algorithm) -> None:
    """Refuse secure aggregation with an algorithm whose updates carry tensors
    beside the delta: they would travel unmasked (SCAFFOLD's control variates)."""
    server = algorithm.server
    if cfg.privacy.secagg and server is not None and server.update_tensors:
        raise ConfigError(
            f"privacy.secagg: algorithm '{algorithm.name}' sends "
            f"{', '.join(server.update_tensors)} beside each delta, unmasked: the server "
            "would see every client's own tensors; use fedavg or fedprox"
        )


def _check_budget(parts: PrivacyParts) -> None:
    """Refuse to start when even one round would exceed ``target_epsilon``."""
    target = parts.cfg.privacy.target_epsilon
    first = parts.epsilon(1)
    if target is not None and first is not None and first > target:
        raise ConfigError(
            f"privacy.target_epsilon = {target} is spent by the first round already "
            f"(epsilon {first:.3f} at delta {parts.delta:.3g}); raise noise_multiplier "
            "(fedforge.accountant.calibrate_noise finds one) or the budget"
        )


def noise_std_on_sum(parts: PrivacyParts, state: dict[str, Any]) -> float:
    """The central noise std on the sum this round (for reports and tests)."""
    stage = parts.aggregate_stages[0]
    assert isinstance(stage, CentralNoise)
    clip = float(state.get("clip_norm", stage.clip_norm))
    return stage.noise_multiplier * clip


__all__ = ["PrivacyParts", "assemble", "noise_std_on_sum"]


# ----------------------------------------------------------------- order rules
NOISE_STAGES = ("local_dp", "central_dp")


def _clip_before_noise(p: Pipeline) -> str | None:
    names = [s.name for s in p.client]
    noisy = [s.name for s in (*p.client, *p.server_aggregate) if s.name in NOISE_STAGES]
    if not noisy:
        return None
    if "clip" not in names:
        return f"'{noisy[0]}' adds noise calibrated to a clip norm, but no client stage clips"
    if "local_dp" in names and names.index("local_dp") < names.index("clip"):
        return "'local_dp' comes before 'clip': noise is calibrated to the clipped norm"
    return None


def _residual_after_noise(p: Pipeline) -> str | None:
    names = [s.name for s in p.client]
    if "local_dp" not in names:
        return None
    early = [n for n in names[: names.index("local_dp")] if n.endswith("+ef") or n == "ef"]
    if early:
        return (
            f"error feedback '{early[0]}' keeps its residual before 'local_dp': the residual "
            "would hold un-noised data and leak it later; take it after noise"
        )
    return None


def _dp_weights_capped(p: Pipeline) -> str | None:
    central = any(s.name == "central_dp" for s in p.server_aggregate)
    if central and p.aggregator.name != "dp_mean":
        return (
            f"central DP with aggregator '{p.aggregator.name}': example-count weights let one "
            "client outweigh the clip bound; use the DP mean (uniform weights or a weight cap)"
        )
    return None


def _secagg_rules(p: Pipeline) -> str | None:
    if p.codec.name != "secagg":
        return None
    agg = p.aggregator
    if agg.needs_individual or not agg.linear:
        return (
            f"secure aggregation shows the server only the sum, but aggregator '{agg.name}' "
            "needs individual updates; use robust.aggregator = mean"
        )
    if p.cohort:
        return (
            f"secure aggregation hides each update, so the per-upload/cohort gate "
            f"'{p.cohort[0].name}' cannot see it; remove robust.norm_gate and colluding attacks"
        )
    nonlinear = [s.name for s in p.server_upload if not s.linear]
    if nonlinear:
        return f"server upload stage '{nonlinear[0]}' is not linear: it cannot run on a sum"
    names = [s.name for s in p.client]
    last_dp = max((i for i, n in enumerate(names) if n in ("clip", "local_dp")), default=-1)
    late = [s.name for s in p.client[last_dp + 1 :] if not s.linear]
    if late:
        return (
            f"client stage '{late[0]}' between DP and the secure-aggregation mask is not "
            "linear: the server could not undo it on the sum"
        )
    check = getattr(p.codec, "wrap_reason", None)
    return check() if callable(check) else None


RULES.extend([_clip_before_noise, _residual_after_noise, _dp_weights_capped, _secagg_rules])

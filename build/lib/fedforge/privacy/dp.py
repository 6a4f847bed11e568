"""Differential privacy stages: DP-FedAvg (McMahan et al. 2018, "Learning
differentially private recurrent language models"), local DP, distributed DP
(the continuous-Gaussian form of Kairouz, Liu and Steinke 2021, "The distributed
discrete Gaussian mechanism for federated learning with secure aggregation"),
and adaptive clipping (Andrew et al. 2021, "Differentially private learning with
adaptive clipping").

Central DP: each client clips its delta (``Clip``, client); the server sums the
clipped deltas with weights at most 1 (uniform, or min(n_k / cap, 1)), divides by
a fixed denominator D (the expected total weight of a cohort, so that one
client's presence changes the sum by at most C) and adds Gaussian noise of std
z C to the sum, i.e. z C / D to the mean (``CentralNoise``, server, on the
aggregate). Local DP: each client adds noise of std z C itself before upload
(``LocalNoise``, client); the server is not trusted. Distributed DP: each client
adds noise of std z C / sqrt(n_min) before the secure-aggregation mask
(``DistributedNoise``, client); the server, trusted with nothing but the sum,
sees the masked sum of at least n_min such updates, which carries at least the
central noise z C. Noise comes from derived
generators (seed, round[, client], purpose): reruns are bit-identical, and
whoever knows the run's seed can regenerate the noise and subtract it (a review
recovered local-DP updates to 4e-16 so). With ``secret`` (``privacy.secret_noise``)
every draw is seeded from the OS's CSPRNG instead, and runs do not repeat bit
for bit. The cohorts stay derived from the seed: local DP, the tiers and
distributed DP's epsilon against the server (which knows whom it sampled) need
no more; the amplification by sampling in central and distributed DP's epsilon
against those who see the models assumes they do not know the seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedforge.aggregation.mean import Accumulator
from fedforge.core.rng import noise_generator
from fedforge.pipeline.constraints import CalibratedToClip, NeedsAggregator, NeedsMasking
from fedforge.pipeline.pipeline import Constraint, Role, StageContext, Where


def gaussian(like: torch.Tensor, std: float, gen: torch.Generator) -> torch.Tensor:
    """N(0, std^2) noise shaped like ``like`` (drawn in float64, cast to its dtype)."""
    noise = torch.randn(like.shape, generator=gen, dtype=torch.float64)
    return (noise * std).to(like.dtype)


class _FixedDenominatorSum:
    def __init__(self, size: int, dtype: torch.dtype, mean: DPMean) -> None:
        self._sum = torch.zeros(size, dtype=dtype)
        self._mean = mean
        self._count = 0

    def add(self, update: torch.Tensor, weight: float) -> None:
        self._sum.add_(update.to(self._sum.dtype), alpha=self._mean.weight(weight))
        self._count += 1

    def result(self) -> torch.Tensor:
        return self._sum / self._mean.denominator

    @property
    def count(self) -> int:
        return self._count


class DPMean:
    """McMahan et al.'s fixed-denominator estimator: sum_k w_k u_k / D with
    w_k = 1 (uniform) or min(n_k / cap, 1) (capped), so one client moves the
    sum by at most its clip norm whatever ``num_examples`` it reports."""

    name = "dp_mean"
    needs_individual = False
    linear = True

    def __init__(self, denominator: float, weight_cap: int | None = None) -> None:
        if not denominator > 0:
            raise ValueError(f"denominator {denominator} must be > 0")
        self.denominator = denominator
        self.weight_cap = weight_cap

    def weight(self, num_examples: float) -> float:
        return 1.0 if self.weight_cap is None else min(num_examples / self.weight_cap, 1.0)

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w = torch.tensor([self.weight(float(n)) for n in weights], dtype=updates.dtype)
        return (w @ updates) / self.denominator

    def from_sum(self, total: torch.Tensor, num_examples: Sequence[float]) -> torch.Tensor:
        """The aggregate from the sum of the weighted updates (secure aggregation)."""
        return total / self.denominator

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return _FixedDenominatorSum(size, dtype, self)


class CentralNoise:
    """Adds N(0, (z C_t / D)^2) to the aggregate mean: z C_t on the sum. C_t is
    the round's clip norm (``ctx.state['clip_norm']`` under adaptive clipping)."""

    name = "central_dp"
    where: Where = "server_aggregate"
    role: Role = "noise"
    linear = True
    constraints: tuple[Constraint, ...] = (
        CalibratedToClip(),
        NeedsAggregator(
            DPMean,
            "example-count weights let one client outweigh the clip bound; use the DP mean "
            "(uniform weights or a weight cap)",
        ),
    )

    def __init__(
        self, noise_multiplier: float, clip_norm: float, denominator: float, secret: bool = False
    ) -> None:
        if not (noise_multiplier >= 0 and clip_norm > 0 and denominator > 0):
            raise ValueError("need noise_multiplier >= 0, clip_norm > 0, denominator > 0")
        self.noise_multiplier = noise_multiplier
        self.clip_norm = clip_norm
        self.denominator = denominator
        self.secret = secret

    def std(self, ctx: StageContext) -> float:
        """The noise std on the mean in round ``ctx.round_idx``."""
        clip = float(ctx.state.get("clip_norm", self.clip_norm))
        return self.noise_multiplier * clip / self.denominator

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        gen = noise_generator(self.secret, ctx.seed, "central_dp", ctx.round_idx)
        return vec + gaussian(vec, self.std(ctx), gen)


class LocalNoise:
    """Adds N(0, (z C)^2) to a client's clipped delta, on the client."""

    name = "local_dp"
    where: Where = "client"
    role: Role = "noise"
    linear = True
    constraints: tuple[Constraint, ...] = (CalibratedToClip(),)

    def __init__(self, noise_multiplier: float, clip_norm: float, secret: bool = False) -> None:
        if not (noise_multiplier > 0 and clip_norm > 0):
            raise ValueError("local DP needs noise_multiplier > 0 and clip_norm > 0")
        self.noise_multiplier = noise_multiplier
        self.clip_norm = clip_norm
        self.secret = secret

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        gen = noise_generator(self.secret, ctx.seed, "local_dp", ctx.round_idx, ctx.client_id or 0)
        return vec + gaussian(vec, self.noise_multiplier * self.clip_norm, gen)


class DistributedNoise:
    """Adds N(0, (z C)^2 / n_min) to a client's clipped delta, on the client, before
    secure aggregation masks it. n_min is the fewest inputs secure aggregation puts
    in a sum (its threshold), so the sum of k >= n_min of them carries noise of
    variance k (z C)^2 / n_min >= (z C)^2: at least central DP's noise on the sum,
    and exactly it when k = n_min (the accountant assumes that: with more survivors
    the noise is larger and the epsilon reported is an upper bound)."""

    name = "distributed_dp"
    where: Where = "client"
    role: Role = "noise"
    linear = True
    constraints: tuple[Constraint, ...] = (
        CalibratedToClip(),
        NeedsMasking(
            "adds only sigma / sqrt(n_min) per client",
            "each update with that fraction of the noise",
        ),
    )

    def __init__(
        self, noise_multiplier: float, clip_norm: float, min_survivors: int, secret: bool = False
    ) -> None:
        if not (noise_multiplier > 0 and clip_norm > 0 and min_survivors >= 1):
            raise ValueError("need noise_multiplier > 0, clip_norm > 0, min_survivors >= 1")
        self.noise_multiplier = noise_multiplier
        self.clip_norm = clip_norm
        self.min_survivors = min_survivors
        self.secret = secret

    @property
    def std(self) -> float:
        """One client's noise std: z C / sqrt(n_min)."""
        return self.noise_multiplier * self.clip_norm / math.sqrt(self.min_survivors)

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        who = ctx.client_id or 0
        gen = noise_generator(self.secret, ctx.seed, "distributed_dp", ctx.round_idx, who)
        return vec + gaussian(vec, self.std, gen)


def expected_weight(
    num_examples: Sequence[int], sampling_rate: float, weight_cap: int | None
) -> float:
    """D = q sum_k w_k over all clients: the expected total weight of a cohort."""
    if weight_cap is None:
        return sampling_rate * len(num_examples)
    return sampling_rate * sum(min(n / weight_cap, 1.0) for n in num_examples)


def update_noise_multiplier(noise_multiplier: float, count_std: float) -> float:
    """z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al. 2021, Thm 1): the
    update's share of a total budget z when the clipped count carries sigma_b."""
    rest = noise_multiplier**-2 - (2 * count_std) ** -2
    if rest <= 0:
        raise ValueError(
            f"clip_count_std = {count_std} is too small for noise_multiplier = "
            f"{noise_multiplier}: need clip_count_std > z / 2 = {noise_multiplier / 2:g}"
        )
    return rest**-0.5


def next_clip_norm(
    clip_norm: float,
    unclipped: int,
    counted: int,
    expected_cohort: float,
    count_std: float,
    target_quantile: float,
    clip_lr: float,
    gen: torch.Generator,
) -> float:
    """C <- C exp(-eta (b - gamma)), b the noisy fraction of unclipped deltas.
    The released count is centred, sum over the ``counted`` clients of (b_i - 1/2)
    plus N(0, sigma_b^2), as Andrew et al. (and TF-Privacy's quantile query)
    release it: one client more or less moves it by 1/2, the sensitivity their
    noise split assumes (the plain count moves by 1 under Poisson sampling);
    b = that / E[cohort] + 1/2. A fixed cohort gives the plain count's value."""
    noise = float(torch.randn((), generator=gen, dtype=torch.float64)) * count_std
    b = (unclipped - counted / 2 + noise) / expected_cohort + 0.5
    return clip_norm * math.exp(-clip_lr * (b - target_quantile))

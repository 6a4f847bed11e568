"""Privacy tiers (clients differ in how sensitive their
data is, so they need not all pay for the same protection; the hybrid of secure
aggregation and local noise follows Truex et al. 2019, "A hybrid approach to
privacy-preserving federated learning").

Each client has a sensitivity level: ``high`` clients clip and add local DP noise
N(0, (z C)^2) before the secure-aggregation mask; ``low`` clients clip only, and
rely on secure aggregation alone (the server sees only the sum, but the sum
itself carries no noise for them: no epsilon). Runs on the client
(``TieredNoise``); the tier of each client is public, drawn once from the seed
(``high_tier``) or listed in the config.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from fedforge.core.errors import invalid_field
from fedforge.core.rng import noise_generator, numpy_rng
from fedforge.pipeline.constraints import CalibratedToClip
from fedforge.pipeline.pipeline import Constraint, Role, StageContext, Where
from fedforge.privacy.dp import gaussian

TIERS = ("high", "low")


def high_tier(
    num_clients: int, high_fraction: float, high_clients: Collection[int], seed: int
) -> frozenset[int]:
    """The clients of the high tier: ``high_clients`` as given, or
    round(high_fraction * num_clients) clients drawn from (seed, "privacy_tiers")."""
    if high_clients:
        bad = sorted(c for c in high_clients if not 0 <= c < num_clients)
        if bad:
            raise invalid_field(
                "privacy.tiers.high_clients",
                bad,
                f"must be client ids in 0..{num_clients - 1} (num_clients = {num_clients})",
            )
        return frozenset(int(c) for c in high_clients)
    n = int(round(high_fraction * num_clients))
    pick = numpy_rng(seed, "privacy_tiers").choice(num_clients, n, replace=False)
    return frozenset(int(c) for c in pick.tolist())


class TieredNoise:
    """Adds N(0, (z C)^2) to the clipped delta of a high-tier client (the draw
    local DP would make for it: purpose "local_dp"); a low-tier client's delta
    passes unchanged."""

    name = "tiered_dp"
    where: Where = "client"
    role: Role = "noise"
    linear = True
    constraints: tuple[Constraint, ...] = (CalibratedToClip(),)

    def __init__(
        self,
        noise_multiplier: float,
        clip_norm: float,
        high: Collection[int],
        secret: bool = False,
    ) -> None:
        if not (noise_multiplier > 0 and clip_norm > 0):
            raise ValueError("tiered local DP needs noise_multiplier > 0 and clip_norm > 0")
        self.noise_multiplier = noise_multiplier
        self.clip_norm = clip_norm
        self.high = frozenset(high)
        self.secret = secret  # see stages/dp.py

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        client = ctx.client_id or 0
        if client not in self.high:
            return vec
        gen = noise_generator(self.secret, ctx.seed, "local_dp", ctx.round_idx, client)
        return vec + gaussian(vec, self.noise_multiplier * self.clip_norm, gen)

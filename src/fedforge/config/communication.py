"""The ``communication:`` config section: what travels and how often (see
fedforge.compression.quantize, .sparsify, .feedback, .clip and
fedforge.server.collectors.hierarchical). The section checks its own fields, with errors
naming the field; how it combines with the rest of the run is checked in
compat.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedforge.core.errors import FieldCheck, raise_first

# dense, float16, bfloat16, int8, int4, int2, sign, topk, randk or a plugin's: a
# registered codec name (core/registry.py)
UplinkCodec = str
DownlinkCodec = Literal["dense", "float16", "bfloat16", "int8", "int4"]


@dataclass(frozen=True)
class CommunicationConfig:
    """What travels and how often."""

    uplink: UplinkCodec = "dense"  # the codec of client updates
    downlink: DownlinkCodec = "dense"  # the codec of the payload (the global model)
    rounding: Literal["stochastic", "nearest"] = "stochastic"  # int*, sign
    scale: Literal["chunk", "tensor"] = "chunk"  # int*, sign: one scale per chunk or tensor
    chunk_size: int = 1024  # scale: chunk
    fraction: float = 0.01  # topk, randk: p, the fraction of coordinates sent
    randk_per_client: bool = False  # randk: a set per client (false: one per round, linear)
    error_feedback: bool = False  # keep what the uplink codec dropped, add it next time
    clip_norm: float | None = None  # clip each delta to this L2 norm; null = off
    upload_every: int = 1  # k: a cohort trains k rounds locally, then uploads once
    groups: int = 0  # hierarchical aggregation over this many edge groups; 0 = off
    group_by: Literal["contiguous", "label"] = "contiguous"  # client -> group

    def check(self) -> None:
        """The section's own fields (``groups`` against ``num_clients``: compat.py)."""
        raise_first(
            "communication.",
            [
                (
                    "chunk_size",
                    self.chunk_size,
                    self.chunk_size >= 1,
                    "must be an integer >= 1",
                ),
                (
                    "fraction",
                    self.fraction,
                    0.0 < self.fraction <= 1.0,
                    "must be in (0, 1] (top-k/random-k keep max(1, floor(fraction * P)) "
                    "coordinates)",
                ),
                (
                    "clip_norm",
                    self.clip_norm,
                    self.clip_norm is None or self.clip_norm > 0.0,
                    "must be a number > 0, or null (no clipping)",
                ),
                (
                    "upload_every",
                    self.upload_every,
                    self.upload_every >= 1,
                    "must be an integer >= 1",
                ),
                *self._feedback_checks(),
            ],
        )

    def _feedback_checks(self) -> list[FieldCheck]:
        lossy = self.uplink != "dense"
        return [
            (
                "error_feedback",
                self.error_feedback,
                not self.error_feedback or lossy,
                "needs a lossy uplink codec (dense drops nothing); allowed with: "
                "float16, bfloat16, int8, int4, int2, sign, topk, randk",
            ),
            (
                "error_feedback",
                self.error_feedback,
                not self.error_feedback
                or self.rounding == "nearest"
                or self.uplink not in ("sign", "int2"),
                f"with uplink '{self.uplink}' needs rounding: nearest (stochastic "
                f"{self.uplink} loses more than its input, ||C(x) - x|| > ||x||, and the "
                "residual grows without bound: measured x2 a round; Karimireddy et al.'s "
                "scaled sign is the nearest one)",
            ),
        ]

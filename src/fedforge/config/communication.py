"""The ``communication:`` config section: what travels and how often (see
fedforge.communication.quantize, .sparsify, .feedback, .clip and
fedforge.server.collectors.hierarchical). The section checks its own fields, with errors
naming the field; how it combines with the rest of the run is checked in
compat.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_BYTES, MAX_CLIENTS, MAX_EXAMPLES, MAX_ROUNDS
from fedforge.config.ranges import Most, Range
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
    chunk_size: Annotated[int, Range(">= 1"), Most(MAX_EXAMPLES, "values a chunk")] = (
        1024  # scale: chunk
    )
    # topk, randk: p, the fraction of coordinates sent
    fraction: Annotated[
        float, Range("(0, 1]", note="top-k/random-k keep max(1, floor(fraction * P)) coordinates")
    ] = 0.01
    randk_per_client: bool = False  # randk: a set per client (false: one per round, linear)
    error_feedback: bool = False  # keep what the uplink codec dropped, add it next time
    # clip each delta to this L2 norm; null = off
    clip_norm: Annotated[float | None, Range("> 0", null="no clipping")] = None
    # clip each delta to this multiple of the median norm, before the clients'
    # clip (each reports its own), of the updates taken in the last
    # robust.norm_window rounds, the bound sent with the round (below 1: most
    # clients are clipped every round); the first round (none taken before) is
    # not clipped; null = off (server/client_lr.py)
    clip_multiple: Annotated[float | None, Range("> 0", null="no clipping")] = None
    # k: a cohort trains k rounds locally, then uploads once
    upload_every: Annotated[int, Range(">= 1"), Most(MAX_ROUNDS, "rounds")] = 1
    groups: Annotated[int, Most(MAX_CLIENTS, "clients", least=0)] = (
        0  # hierarchical aggregation over this many edge groups; 0 = off
    )
    group_by: Literal["contiguous", "label"] = "contiguous"  # client -> group
    # stop at the end of the round whose bytes moved so far (up + down, as the
    # summary's bytes_up + bytes_down count them) reach this many; null: no budget
    byte_budget: Annotated[
        int | None, Range(">= 1", null="no budget"), Most(MAX_BYTES, "bytes")
    ] = None

    def check(self) -> None:
        """Error feedback against the codec (``groups`` against ``num_clients``: compat.py)."""
        raise_first("communication.", self._feedback_checks())

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

"""The uplink over the shared part of the model alone.

Entries each client keeps for itself (FedBN's batch norm, ``local_params``) never
leave the client: the update on the wire is the codec's encoding of the other
entries, in the flat vector's order, and the server reads the kept ones as
zeros (it never moves them in the global vector). The codec is built over the
shared entries' spec (``shared_spec``), so one that works per tensor (a scale
per tensor) sees the tensors it sends, and error feedback keeps a residual of
the shared length. Under secure aggregation the masked update is the whole
vector, zeros where the clients keep theirs (its masks span one length).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedforge.communication.feedback import ErrorFeedback
from fedforge.core.params import ParamEntry, ParamSpec
from fedforge.pipeline.codec import CodecContext, Encoded
from fedforge.pipeline.pipeline import Codec, Constraint


def shared_spec(spec: ParamSpec, kept: torch.Tensor) -> ParamSpec:
    """The entries of ``spec`` no client keeps (``kept``: the [P] mask of kept
    entries, whole tensors), laid out one after another."""
    entries: list[ParamEntry] = []
    offset = 0
    for e in spec.entries:
        part = kept[e.slice]
        if bool(part.all()):
            continue
        if bool(part.any()):
            raise ValueError(f"tensor '{e.name}' is kept by the clients only in part")
        entries.append(ParamEntry(e.name, e.shape, offset, e.kind, e.frozen))
        offset += e.numel
    return ParamSpec(tuple(entries))


class SharedPart:
    """``codec`` over the entries outside ``kept``: an update of P entries is sent
    as the codec's encoding of its shared ones, and read back as P entries with
    zeros where the clients keep theirs."""

    def __init__(self, codec: Codec, runs: tuple[tuple[int, int], ...]) -> None:
        self.codec = codec
        self.runs = runs  # the shared entries: [start, end) runs of the flat vector, in order
        self.size = sum(b - a for a, b in runs)
        self.name = codec.name
        self.linear = codec.linear  # a scatter of a linear codec's output is linear
        self.lossy = codec.lossy

    @property
    def constraints(self) -> tuple[Constraint, ...]:
        return self.codec.constraints

    @classmethod
    def outside(cls, codec: Codec, kept: torch.Tensor) -> SharedPart:
        """``codec`` over the entries outside ``kept`` (the [P] mask)."""
        shared = torch.cat([torch.zeros(1, dtype=torch.int8), (~kept).to(torch.int8)])
        edges = torch.diff(torch.cat([shared, torch.zeros(1, dtype=torch.int8)]))
        starts = (edges == 1).nonzero().flatten().tolist()
        ends = (edges == -1).nonzero().flatten().tolist()
        return cls(codec, tuple(zip(starts, ends, strict=True)))

    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded:
        return self.codec.encode(torch.cat([delta[a:b] for a, b in self.runs]), ctx)

    def decode(
        self,
        tensors: Mapping[str, torch.Tensor],
        meta: Mapping[str, Any],
        size: int,
        dtype: torch.dtype,
        ctx: CodecContext | None = None,
    ) -> torch.Tensor:
        part = self.codec.decode(tensors, meta, self.size, dtype, ctx)
        out = torch.zeros(size, dtype=part.dtype)
        at = 0
        for a, b in self.runs:
            out[a:b] = part[at : at + b - a]
            at += b - a
        return out


def memoryless(codec: Codec) -> Codec:
    """``codec`` without error feedback's residuals (the wire's encoding as it is:
    what the server re-encodes for a simulated attacker, which keeps no residual
    and must not touch a client's)."""
    if isinstance(codec, SharedPart):
        return SharedPart(memoryless(codec.codec), codec.runs)
    if isinstance(codec, ErrorFeedback):
        return codec.codec
    return codec


__all__ = ["SharedPart", "memoryless", "shared_spec"]

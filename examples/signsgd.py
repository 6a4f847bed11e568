"""signSGD with majority vote (Bernstein et al. 2018, "signSGD: Compressed
Optimisation for Non-Convex Problems"; Bernstein et al. 2019,
"signSGD with Majority Vote is Communication Efficient and Fault Tolerant").

Each client uploads sign(delta) of its local update, one bit a parameter (the
codec ``signsgd``: 8 signs a byte, the first in the lowest bit; a zero entry
counts as +1); the server takes the elementwise majority, sign(sum of the
signs), and moves the model by ``step`` times it (the aggregator
``majority_vote``; a tied coordinate, an even cohort split half and half, does
not move). With ``local_epochs: 1`` and ``batch_size: null`` each client's delta
is -lr times its full gradient, so this is the paper's algorithm with one
worker per client; with more local steps it votes on the signs of local updates.

    fedforge run --plugin examples/signsgd.py --config examples/signsgd.yaml

A codec and an aggregator, both registered here. Every client has one vote
(the weights are not used). The vote must see each sign vector's sum, which
a running sum gives, so it streams; it is not a mean, so it is not offered to
secure aggregation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import fedforge
from fedforge.pipeline.codec import CodecContext, Encoded, Received, WireCodec


class SignCodec(WireCodec):
    """sign(delta) as one bit an entry (bit 1: >= 0); decodes to +-1."""

    name = "signsgd"
    sends = frozenset({"signs"})
    linear = False
    lossy = True
    constraints = ()

    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded:
        bits = (delta >= 0).numpy().astype(np.uint8)
        packed = torch.from_numpy(np.packbits(bits, bitorder="little"))
        return {"signs": packed}, {"codec": self.name}

    def rebuild(self, got: Received) -> torch.Tensor:
        packed = got.tensor("signs", ((got.size + 7) // 8,), torch.uint8)
        bits = np.unpackbits(packed.numpy(), bitorder="little")
        if bits[got.size :].any():
            raise fedforge.UploadError("signs have non-zero padding bits after the last one")
        ones = torch.from_numpy(bits[: got.size].astype(np.int8)).to(got.dtype)
        return 2 * ones - 1


@dataclass(frozen=True)
class VoteOptions:
    step: float = 0.001  # the server's step size: w += step * sign(sum of signs)

    def check(self) -> None:
        if not self.step > 0:
            raise ValueError(f"step = {self.step} must be > 0")


class _Votes:
    """The running sum of the votes (one per client, the weights unused)."""

    def __init__(self, step: float, size: int, dtype: torch.dtype) -> None:
        self.step, self.total, self.count = step, torch.zeros(size, dtype=dtype), 0

    def add(self, update: torch.Tensor, weight: float) -> None:
        self.total += update.to(self.total.dtype)
        self.count += 1

    def result(self) -> torch.Tensor:
        return self.step * torch.sign(self.total)


class MajorityVote:
    name = "majority_vote"
    needs_individual = False
    linear = False  # sign(sum): not a mean, and not offered to secure aggregation

    def __init__(self, step: float) -> None:
        self.step = step

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.step * torch.sign(updates.sum(dim=0))

    def start(self, size: int, dtype: torch.dtype) -> _Votes:
        return _Votes(self.step, size, dtype)


fedforge.register_codec("signsgd", lambda context: SignCodec())
fedforge.register_aggregator(
    "majority_vote", lambda context: MajorityVote(context.options.step), options=VoteOptions
)

"""Sparsification codecs: top-k and random-k, k = max(1, floor(p P)).

- ``topk``: the k coordinates of largest magnitude (Aji & Heafield 2017, "Sparse
  communication for distributed gradient descent"; Stich et al. 2018, "Sparsified
  SGD with memory", which adds the error feedback of ``feedback.py``). The
  indices travel, delta-coded or as a bitmap, whichever is smaller (``bits.py``).
- ``randk``: k coordinates drawn from a generator derived from (seed, round,
  purpose) (Konecny et al. 2016, "Federated learning: strategies for improving
  communication efficiency", random masks; Stich et al. 2018). Server and clients
  derive the same index set, so only the values travel. By default the set is
  shared by the whole cohort of a round: the codec is then linear across
  clients (the sum of encodings is the encoding of the sum), which is what
  secure aggregation needs; ``per_client`` draws a set per client instead.
  Values are sent unscaled (biased by k / P; meant for use with error feedback).

On the wire: ``values`` (the run's dtype, k of them) and, for top-k,
``indices`` (uint8) with ``index_coding`` in the meta. Runs on both sides; decode
refuses wrong headers, wrong counts, and indices truncated, out of range or
repeated.
"""

from __future__ import annotations

import torch

from fedforge.communication.bits import decode_indices, encode_indices, index_bytes
from fedforge.core.errors import UploadError
from fedforge.core.rng import torch_generator
from fedforge.pipeline.codec import CodecContext, Encoded, Received, WireCodec, need_context


def count_kept(size: int, fraction: float) -> int:
    """k = max(1, floor(fraction * size)) (with a tolerance so 0.01 * 100 is 1)."""
    return max(1, min(size, int(fraction * size + 1e-9)))


def _scattered(idx: torch.Tensor, values: torch.Tensor, size: int) -> torch.Tensor:
    """The ``[size]`` vector of ``values`` at ``idx``, zero elsewhere."""
    out = torch.zeros(size, dtype=values.dtype)
    out[idx] = values
    return out


def _check_fraction(fraction: float) -> None:
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction = {fraction} must be in (0, 1]")


class TopK(WireCodec):
    """The k largest-magnitude coordinates and their indices."""

    name = "topk"
    sends = frozenset({"values", "indices"})
    linear = False
    lossy = True
    constraints = ()  # fits any pipeline

    def __init__(self, fraction: float) -> None:
        _check_fraction(fraction)
        self.fraction = fraction

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """The sorted indices of the k largest |x| (ties: torch.topk's choice)."""
        k = count_kept(x.numel(), self.fraction)
        return torch.sort(torch.topk(x.abs(), k, sorted=False).indices).values

    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded:
        x = delta.reshape(-1)
        idx = self.select(x)
        coded, coding = encode_indices(idx, x.numel())
        return {"values": x[idx], "indices": coded}, {"codec": self.name, "index_coding": coding}

    def rebuild(self, got: Received) -> torch.Tensor:
        k = count_kept(got.size, self.fraction)
        values = got.tensor("values", (k,), got.dtype)
        coded = got.tensors.get("indices")
        if coded is None:
            raise UploadError("update carries no 'indices' tensor")
        idx = decode_indices(coded, got.meta.get("index_coding"), k, got.size)
        return _scattered(idx, values, got.size)

    def payload_bytes(self, delta: torch.Tensor) -> int:
        """Tensor bytes of this delta's encoding: k values plus the smaller index coding."""
        x = delta.reshape(-1)
        idx = self.select(x)
        return idx.numel() * x.element_size() + index_bytes(idx, x.numel())[0]


class RandomK(WireCodec):
    """k coordinates from a derived generator; only their values travel."""

    name = "randk"
    sends = frozenset({"values"})
    linear = True
    lossy = True
    constraints = ()  # fits any pipeline

    def __init__(self, fraction: float, per_client: bool = False) -> None:
        _check_fraction(fraction)
        self.fraction = fraction
        self.per_client = per_client

    def indices(self, size: int, ctx: CodecContext) -> torch.Tensor:
        """The sorted index set of this round (and client, when per client)."""
        k = count_kept(size, self.fraction)
        who = ctx.client_id if self.per_client and ctx.client_id is not None else "cohort"
        gen = torch_generator(ctx.seed, "randk", ctx.round_idx, who)
        return torch.sort(torch.randperm(size, generator=gen)[:k]).values

    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded:
        x = delta.reshape(-1)
        idx = self.indices(x.numel(), need_context(ctx, self.name))
        return {"values": x[idx]}, {"codec": self.name}

    def rebuild(self, got: Received) -> torch.Tensor:
        idx = self.indices(got.size, need_context(got.ctx, self.name))
        values = got.tensor("values", (idx.numel(),), got.dtype)
        return _scattered(idx, values, got.size)

    def payload_bytes(self, size: int, itemsize: int) -> int:
        return count_kept(size, self.fraction) * itemsize

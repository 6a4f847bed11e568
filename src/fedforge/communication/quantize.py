"""Quantisation codecs: b-bit (8, 4, 2) and 1-bit sign updates with a scale, and
float16/bfloat16 casting as the cheap baseline.

- ``int8``/``int4``/``int2``: QSGD-style uniform quantisation (Alistarh et al.
  2017, "QSGD"; Suresh et al. 2017): per segment (a tensor of the ParamSpec or
  a fixed chunk) a scale s = max|x| and ``L = 2**(b-1) - 1`` levels a side, so
  q = round(x / s * L) in [-L, L] and x_hat = q s / L. Stochastic rounding
  (floor(y + u), u ~ U[0, 1)) is unbiased, E[x_hat] = x, with error below s / L;
  round-to-nearest is biased with error at most s / (2 L). 2 bits is ternary
  (-1, 0, 1; Wen et al. 2017, "TernGrad").
- ``sign``: 1 bit a parameter (Seide et al. 2014, "1-bit SGD"; Bernstein et al.
  2018, "signSGD"). Deterministic: x_hat = s sign(x) with s = mean|x| per segment,
  the scale of EF-signSGD (Karimireddy et al. 2019). Stochastic: s = max|x| and
  P(+s) = (1 + x / s) / 2, which is unbiased.
- ``float16``/``bfloat16``: round to nearest, ties to even, from float32 and
  float64 alike (Micikevicius et al. 2018).

On the wire: ``codes`` (uint8, packed ``8 // b`` a byte), ``scale`` (float32, one a
segment). Runs on both sides; decode trusts nothing: wrong codec header, wrong
shapes, codes out of range, non-zero padding and bad scales are refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedforge.communication.bits import pack, packed_size, unpack
from fedforge.core.errors import UploadError
from fedforge.pipeline.codec import CodecContext, Encoded, Received, WireCodec, need_context

QUANT_BITS = (8, 4, 2, 1)


def segment_lengths(size: int, chunk: int | None, tensor_sizes: Sequence[int]) -> list[int]:
    """Lengths of the scale segments of a ``size`` vector: fixed chunks of ``chunk``
    (the last one shorter), or one per tensor when ``chunk`` is None."""
    if chunk is None:
        if sum(tensor_sizes) != size:
            raise ValueError(f"tensor sizes sum to {sum(tensor_sizes)}, the vector has {size}")
        return [int(n) for n in tensor_sizes]
    full, rest = divmod(size, chunk)
    return [chunk] * full + ([rest] if rest else [])


class Quantize(WireCodec):
    """b-bit (8, 4, 2) or 1-bit sign quantisation with a float32 scale a segment."""

    sends = frozenset({"codes", "scale"})
    linear = False
    lossy = True
    constraints = ()  # fits any pipeline

    def __init__(
        self,
        bits: int,
        stochastic: bool = True,
        chunk: int | None = 1024,
        tensor_sizes: Sequence[int] = (),
    ) -> None:
        if bits not in QUANT_BITS:
            raise ValueError(f"bits = {bits}; allowed: {QUANT_BITS}")
        if chunk is not None and chunk < 1:
            raise ValueError(f"chunk = {chunk} must be >= 1 (or None: one scale a tensor)")
        self.bits = bits
        self.stochastic = stochastic
        self.chunk = chunk
        self.tensor_sizes = tuple(tensor_sizes)
        self.levels = 2 ** (bits - 1) - 1  # 127, 7, 1; unused by sign
        self.name = "sign" if bits == 1 else f"int{bits}"

    def _segments(self, size: int, device: torch.device) -> tuple[list[int], torch.Tensor]:
        lengths = segment_lengths(size, self.chunk, self.tensor_sizes)
        ids = torch.repeat_interleave(
            torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device)
        )
        return lengths, ids

    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded:
        x = delta.reshape(-1)
        lengths, ids = self._segments(x.numel(), x.device)
        mag = x.abs()
        if self.bits == 1 and not self.stochastic:
            # summed in float64: a float32 sum of |x| overflows for finite updates
            # whose mean float32 holds (a segment of 1,024 values of 1e36)
            sums = torch.zeros(len(lengths), dtype=torch.float64).index_add_(0, ids, mag.double())
            lens = torch.tensor(lengths, dtype=torch.float64).clamp(min=1)
            scale = (sums / lens).to(torch.float32)
            codes = (x >= 0).to(torch.uint8)
            return {"codes": pack(codes, 1), "scale": scale}, {"codec": self.name}
        smax = torch.zeros(len(lengths), dtype=x.dtype).scatter_reduce_(
            0, ids, mag, "amax", include_self=True
        )
        scale = smax.to(torch.float32)
        low = scale.to(x.dtype) < smax  # float32 rounded the scale down: take the next one up
        scale = torch.where(low, torch.nextafter(scale, torch.full_like(scale, torch.inf)), scale)
        s = scale.to(x.dtype)
        s = torch.where(s > 0, s, torch.ones_like(s))[ids]
        gen = need_context(ctx, self.name).generator("quantize") if self.stochastic else None
        if self.bits == 1:  # stochastic sign: P(+) = (1 + x / s) / 2
            u = torch.rand(x.shape, generator=gen, dtype=x.dtype)
            codes = (u < (1 + x / s) / 2).to(torch.uint8)
            return {"codes": pack(codes, 1), "scale": scale}, {"codec": self.name}
        y = (x / s * self.levels).clamp(-self.levels, self.levels)
        if gen is not None:
            q = torch.floor(y + torch.rand(x.shape, generator=gen, dtype=x.dtype))
        else:
            q = torch.round(y)
        q = q.clamp(-self.levels, self.levels).to(torch.int32) + self.levels
        return {"codes": pack(q, self.bits), "scale": scale}, {"codec": self.name}

    def rebuild(self, got: Received) -> torch.Tensor:
        size, dtype = got.size, got.dtype
        lengths, ids = self._segments(size, torch.device("cpu"))
        scale = got.tensor("scale", (len(lengths),), torch.float32)
        if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
            raise UploadError("scales must be finite and >= 0")
        codes = got.tensors.get("codes")
        if codes is None:
            raise UploadError("update carries no 'codes' tensor")
        q = unpack(codes, self.bits, size)
        s = scale.to(dtype)[ids]
        if self.bits == 1:
            return (q.to(dtype) * 2 - 1) * s
        if int(q.max()) > 2 * self.levels:
            raise UploadError(
                f"code {int(q.max())} is out of range for {self.bits}-bit codes "
                f"(0..{2 * self.levels})"
            )
        return (q.to(dtype) - self.levels) * (s / self.levels)

    def payload_bytes(self, size: int) -> int:
        """Tensor bytes of one encoded update (the header comes on top)."""
        segments = len(segment_lengths(size, self.chunk, self.tensor_sizes))
        return packed_size(size, self.bits) + 4 * segments


CAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def round_to_nearest(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded to nearest (ties to even) in the 16-bit ``dtype``. Torch casts
    float64 through float32, rounding twice: 1 + 2^-8 + 2^-40 became 1 in
    bfloat16, not 1 + 2^-7. So float64 goes to float32 rounded to odd (towards
    zero, then the last bit set when inexact), which then rounds to nearest
    correctly in any format with 2 or more fewer significand bits (Boldo and
    Melquiond 2008)."""
    if x.dtype != torch.float64:
        return x.to(dtype)
    f = x.to(torch.float32)
    back = f.to(torch.float64)
    inexact = (back != x) & torch.isfinite(x)
    away = inexact & (back.abs() > x.abs())  # rounded away from zero: step back
    f = torch.where(away, torch.nextafter(f, torch.zeros_like(f)), f)
    bits = f.view(torch.int32)
    odd = torch.where(inexact, bits | 1, bits)
    return odd.view(torch.float32).to(dtype)


class Cast(WireCodec):
    """The delta in float16 or bfloat16, rounded to nearest: 2 bytes a parameter."""

    sends = frozenset({"delta"})
    linear = False
    lossy = True
    constraints = ()  # fits any pipeline

    def __init__(self, name: str) -> None:
        if name not in CAST_DTYPES:
            raise ValueError(f"cast to {name!r}; allowed: {', '.join(CAST_DTYPES)}")
        self.name = name
        self.wire_dtype = CAST_DTYPES[name]

    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded:
        return {"delta": round_to_nearest(delta, self.wire_dtype)}, {"codec": self.name}

    def rebuild(self, got: Received) -> torch.Tensor:
        return got.tensor("delta", (got.size,), self.wire_dtype).to(got.dtype)

    def payload_bytes(self, size: int) -> int:
        return 2 * size

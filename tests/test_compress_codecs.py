"""Codecs of issue 6: quantisation, casting, top-k, random-k and their encodings.

Numbers are checked against independent computations: the variance of stochastic
rounding, the error bound of each bit width, byte counts from the formulas, a
plain-Python varint length, and sorting by magnitude for top-k.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from fedforge.communication.bits import (
    decode_indices,
    encode_indices,
    pack,
    unpack,
    varint_decode,
    varint_encode,
)
from fedforge.communication.quantize import Cast, Quantize
from fedforge.communication.sparsify import RandomK, TopK, count_kept
from fedforge.core import wire
from fedforge.core.errors import UploadError
from fedforge.pipeline.codec import CodecContext
from fedforge.pipeline.pipeline import Codec

F64 = torch.float64


def _x(n: int, seed: int = 0, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _roundtrip(codec: Codec, x: torch.Tensor, ctx: CodecContext) -> torch.Tensor:
    tensors, meta = codec.encode(x, ctx)
    msg = wire.decode(wire.encode(tensors, meta))  # really across the wire format
    return codec.decode(msg.tensors, msg.meta, x.numel(), x.dtype, ctx)


# ----------------------------------------------------------------------------- packing


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_pack_unpack_round_trip_and_size(bits: int) -> None:
    codes = torch.randint(0, 2**bits, (37,), generator=torch.Generator().manual_seed(bits))
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(37 * bits / 8)
    assert torch.equal(unpack(packed, bits, 37), codes.to(torch.uint8))


def test_pack_is_low_bits_first() -> None:
    assert pack(torch.tensor([1, 2]), 4).tolist() == [0x21]
    assert pack(torch.tensor([1, 0, 0, 1, 1]), 1).tolist() == [0b11001]
    with pytest.raises(UploadError, match="padding"):
        unpack(torch.tensor([0xFF], dtype=torch.uint8), 4, 1)


def _varint_len(v: int) -> int:
    n = 1
    while v >= 128:
        v >>= 7
        n += 1
    return n


def test_varint_against_plain_python() -> None:
    values = np.array([0, 1, 127, 128, 300, 16383, 16384, 2**34 + 5], dtype=np.int64)
    data = varint_encode(values)
    assert len(data) == sum(_varint_len(int(v)) for v in values)
    assert data[:4].tolist() == [0, 1, 127, 0x80]  # 128 = 0x80 0x01
    assert data[4] == 0x01
    assert varint_decode(data, len(values)).tolist() == values.tolist()
    with pytest.raises(UploadError, match="truncated"):
        varint_decode(data[:-1], len(values))
    with pytest.raises(UploadError, match="holds 8 indices; expected 9"):
        varint_decode(data, 9)
    with pytest.raises(UploadError, match="not canonical"):
        varint_decode(np.array([0x81, 0x00], dtype=np.uint8), 1)
    with pytest.raises(UploadError, match="longer than 5"):
        varint_decode(np.array([0xFF] * 5 + [0x01], dtype=np.uint8), 1)


@pytest.mark.parametrize("count", [3, 900])
def test_index_coding_picks_the_smaller(count: int) -> None:
    size = 1000
    idx = torch.sort(torch.randperm(size, generator=torch.Generator().manual_seed(1))[:count])
    data, coding = encode_indices(idx.values, size)
    gaps = np.diff(idx.values.numpy(), prepend=0)
    delta = sum(_varint_len(int(g)) for g in gaps)
    assert data.numel() == min(delta, math.ceil(size / 8))
    assert coding == ("bitmap" if math.ceil(size / 8) < delta else "delta")
    assert torch.equal(decode_indices(data, coding, count, size), idx.values)


def test_malformed_indices_are_refused() -> None:
    size = 100
    gaps = lambda *g: torch.from_numpy(varint_encode(np.array(g)))  # noqa: E731
    assert decode_indices(gaps(3, 4, 90), "delta", 3, size).tolist() == [3, 7, 97]
    with pytest.raises(UploadError, match="out of range"):
        decode_indices(gaps(3, 4, 93), "delta", 3, size)
    with pytest.raises(UploadError, match="repeat"):
        decode_indices(gaps(3, 0, 4), "delta", 3, size)
    with pytest.raises(UploadError, match="expected 3"):
        decode_indices(gaps(3, 4), "delta", 3, size)
    with pytest.raises(UploadError, match="index coding"):
        decode_indices(gaps(3, 4, 5), "golomb", 3, size)
    bitmap = pack((torch.arange(size) % 10 == 0).to(torch.uint8), 1)
    assert decode_indices(bitmap, "bitmap", 10, size).tolist() == list(range(0, 100, 10))
    with pytest.raises(UploadError, match="marks 10 indices; expected 9"):
        decode_indices(bitmap, "bitmap", 9, size)
    with pytest.raises(UploadError, match="shape"):
        decode_indices(bitmap[:-1], "bitmap", 10, size)


# ----------------------------------------------------------------------------- quantisation


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("stochastic", [True, False])
def test_quantize_error_within_bound(bits: int, stochastic: bool) -> None:
    x = _x(5000) * torch.linspace(0.01, 3.0, 5000, dtype=F64)  # varied scales
    q = Quantize(bits, stochastic, chunk=256)
    got = _roundtrip(q, x, CodecContext(0, 0, 1))
    levels = 2 ** (bits - 1) - 1
    seg = torch.arange(5000) // 256
    smax = torch.zeros(20, dtype=F64).scatter_reduce(0, seg, x.abs(), "amax")[seg]
    bound = smax / levels * (1.0 if stochastic else 0.5)
    err = (got - x).abs()
    assert bool((err <= bound * (1 + 1e-6)).all()), float((err / bound).max())
    if stochastic:  # values on the grid of s / L
        grid = got / (smax.float().double() / levels)
        assert torch.allclose(grid, grid.round(), atol=1e-6)


def test_sign_error_within_bound_and_scale_is_mean_abs() -> None:
    x = _x(300)
    q = Quantize(1, stochastic=False, chunk=None, tensor_sizes=[100, 200])
    got = _roundtrip(q, x, CodecContext(0, 0, 1))
    for lo, hi in ((0, 100), (100, 300)):
        s = float(x[lo:hi].abs().mean())
        want = torch.where(x[lo:hi] >= 0, 1.0, -1.0).to(F64) * s
        assert torch.allclose(got[lo:hi], want, rtol=1e-6)  # scale travels as float32
    assert bool(((got - x).abs() <= x.abs().max() + 1e-6).all())


@pytest.mark.parametrize("bits", [8, 4, 2, 1])
def test_stochastic_quantizers_are_unbiased(bits: int) -> None:
    x = _x(400, seed=3)
    q = Quantize(bits, stochastic=True, chunk=100)
    draws = 1500
    total = torch.zeros_like(x)
    for r in range(draws):
        total += _roundtrip(q, x, CodecContext(7, r, 2))
    mean = total / draws
    seg = torch.arange(400) // 100
    s = torch.zeros(4, dtype=F64).scatter_reduce(0, seg, x.abs(), "amax")[seg]
    s = s.float().double()  # the scale on the wire
    if bits == 1:
        var = (s**2 - x**2).clamp(min=0)  # +-s with P(+) = (1 + x/s) / 2
    else:
        step = s / (2 ** (bits - 1) - 1)
        f = torch.frac((x / step).abs())
        var = step**2 * f * (1 - f)  # Bernoulli(f) on a grid of `step`
    tol = 6 * torch.sqrt(var / draws) + 1e-6 * s  # + the float32 rounding of the scale
    assert bool(((mean - x).abs() <= tol).all()), float(((mean - x).abs() / tol).max())
    assert float((mean - x).abs().max()) > 0  # random after all


def test_deterministic_rounding_is_nearest_and_repeatable() -> None:
    x = torch.tensor([1.0, 0.5, -0.26, 0.0, 0.74], dtype=F64)
    q = Quantize(2, stochastic=False, chunk=None, tensor_sizes=[5])
    got = _roundtrip(q, x, CodecContext(0, 0, 0))
    assert got.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]  # torch.round(0.5) is 0: half to even
    x2 = torch.tensor([1.0, 0.51, -0.6, 0.0, 0.49], dtype=F64)
    assert _roundtrip(q, x2, CodecContext(0, 0, 0)).tolist() == [1.0, 1.0, -1.0, 0.0, 0.0]


@pytest.mark.parametrize("name,bound", [("float16", 2**-11), ("bfloat16", 2**-8)])
def test_cast_relative_error(name: str, bound: float) -> None:
    x = _x(1000)
    got = _roundtrip(Cast(name), x, CodecContext(0, 0, 0))
    assert bool(((got - x).abs() <= bound * x.abs()).all())


def _nearest_by_hand(v: float, mantissa: int) -> float:
    """The value of ``mantissa`` significand bits nearest to ``v`` (ties to the
    even significand), by exact rational arithmetic: normal range only."""
    from fractions import Fraction

    exp = math.frexp(v)[1] - mantissa  # v = m 2^exp with m in [2^(p-1), 2^p)
    m = Fraction(v) / Fraction(2) ** exp
    lo = math.floor(m)
    pick = lo + 1 if m - lo > Fraction(1, 2) or (m - lo == Fraction(1, 2) and lo % 2) else lo
    return float(pick * Fraction(2) ** exp)


@pytest.mark.parametrize("name,mantissa", [("float16", 11), ("bfloat16", 8)])
def test_cast_from_float64_rounds_once_to_nearest(name: str, mantissa: int) -> None:
    """Torch's float64 -> 16-bit cast goes through float32 and rounds twice: a
    value just above a 16-bit midpoint came down to the lower neighbour. Against
    exact rational rounding, at and next to midpoints, and at random."""
    gen = np.random.default_rng(5)
    values = []
    for e in range(-10, 10):
        for _ in range(20):
            base = _nearest_by_hand(float(gen.uniform(1, 2)) * 2.0**e, mantissa)
            mid = base + 2.0 ** (math.frexp(base)[1] - mantissa - 1)  # halfway up
            values += [mid, mid + 2.0 ** (e - 40), mid - 2.0 ** (e - 40), -mid - 2.0 ** (e - 40)]
    values += list(gen.standard_normal(500))
    x = torch.tensor(values, dtype=F64)
    got = Cast(name).encode(x)[0]["delta"].double().tolist()
    assert got == [_nearest_by_hand(v, mantissa) for v in values]
    assert x.to(Cast(name).wire_dtype).double().tolist() != got  # torch's cast: twice


def test_sign_scale_of_finite_float32_values_does_not_overflow() -> None:
    """The mean |x| of 1,024 values of 1e36 is 1e36, which float32 holds; their
    float32 sum is inf, and the update was refused for a non-finite scale."""
    x = torch.full((1024,), 1e36, dtype=torch.float32)
    x[::2] *= -1
    sign = Quantize(1, stochastic=False, chunk=None, tensor_sizes=[1024])
    got = _roundtrip(sign, x, CodecContext(0, 0, 0))
    assert torch.equal(got, torch.where(x >= 0, 1e36, -1e36).float())


# ----------------------------------------------------------------------------- sparsification


def test_topk_keeps_the_k_largest_magnitudes() -> None:
    x = _x(2000, seed=5)
    codec = TopK(0.01)
    got = _roundtrip(codec, x, CodecContext(0, 0, 0))
    k = count_kept(2000, 0.01)
    assert k == 20
    want = torch.argsort(x.abs(), descending=True)[:k]
    assert set(torch.nonzero(got).reshape(-1).tolist()) == set(want.tolist())
    assert torch.equal(got[want], x[want])
    assert int((got != 0).sum()) == k


def test_count_kept() -> None:
    assert count_kept(100, 0.01) == 1 and count_kept(50, 0.001) == 1
    assert count_kept(1_663_370, 0.01) == 16_633 and count_kept(10, 1.0) == 10


def test_random_k_is_linear_and_shared() -> None:
    a, b = _x(3000, 1), _x(3000, 2)
    codec = RandomK(0.05)
    ca, cb = CodecContext(4, 9, 0), CodecContext(4, 9, 1)  # two clients, one round
    sum_of = _roundtrip(codec, a, ca) + _roundtrip(codec, b, cb)
    assert torch.equal(sum_of, _roundtrip(codec, a + b, ca))
    assert int((_roundtrip(codec, a, ca) != 0).sum()) == 150
    other_round = _roundtrip(codec, a, CodecContext(4, 10, 0))
    assert not torch.equal(other_round != 0, sum_of != 0)
    per_client = RandomK(0.05, per_client=True)
    pa = _roundtrip(per_client, a, ca)
    assert not torch.equal(pa != 0, _roundtrip(per_client, a, cb) != 0)
    assert torch.equal(pa[pa != 0], a[pa != 0])


# ----------------------------------------------------------------------------- sizes


def _header_len(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> int:
    data = wire.encode(tensors, meta)
    return int.from_bytes(data[4:8], "little")


CHUNK = 1024


@pytest.mark.parametrize(
    "name,codec,formula",
    [
        ("int8", Quantize(8, True, CHUNK), lambda p: p + 4 * math.ceil(p / CHUNK)),
        ("int4", Quantize(4, True, CHUNK), lambda p: math.ceil(p / 2) + 4 * math.ceil(p / CHUNK)),
        ("int2", Quantize(2, False, CHUNK), lambda p: math.ceil(p / 4) + 4 * math.ceil(p / CHUNK)),
        ("sign", Quantize(1, False, CHUNK), lambda p: math.ceil(p / 8) + 4 * math.ceil(p / CHUNK)),
        ("float16", Cast("float16"), lambda p: 2 * p),
        ("bfloat16", Cast("bfloat16"), lambda p: 2 * p),
        ("randk", RandomK(0.01), lambda p: 4 * (p // 100)),
    ],
)
def test_encoded_sizes_match_the_formula(name: str, codec: Codec, formula: Any) -> None:
    p = 10_001
    x = _x(p, dtype=torch.float32)
    tensors, meta = codec.encode(x, CodecContext(0, 0, 3))
    assert meta["codec"] == name
    body = sum(t.numel() * t.element_size() for t in tensors.values())
    assert body == formula(p)
    total = len(wire.encode(tensors, meta))
    assert total == wire.PREFIX_SIZE + _header_len(tensors, meta) + formula(p)


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1, 0.5])
def test_topk_size_is_values_plus_smaller_index_coding(fraction: float) -> None:
    p = 20_000
    x = _x(p, dtype=torch.float32)
    tensors, meta = TopK(fraction).encode(x)
    idx = torch.argsort(x.abs(), descending=True)[: count_kept(p, fraction)].sort().values
    gaps = np.diff(idx.numpy(), prepend=0)
    index_bytes = min(sum(_varint_len(int(g)) for g in gaps), math.ceil(p / 8))
    body = sum(t.numel() * t.element_size() for t in tensors.values())
    assert body == 4 * len(idx) + index_bytes
    assert meta["index_coding"] == ("bitmap" if fraction == 0.5 else "delta")
    assert TopK(fraction).payload_bytes(x) == body


# ----------------------------------------------------------------------------- malformed


def _msg(codec: Codec, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return codec.encode(x, CodecContext(0, 0, 0))


def test_malformed_quantized_updates_are_refused() -> None:
    x = _x(100, dtype=torch.float32)
    q = Quantize(4, True, chunk=32)
    ctx = CodecContext(0, 0, 0)
    tensors, meta = _msg(q, x)
    dec = lambda t, m: q.decode(t, m, 100, torch.float32, ctx)  # noqa: E731
    with pytest.raises(UploadError, match="wrong header.*'int8'.*expected 'int4'"):
        dec(tensors, {**meta, "codec": "int8"})
    with pytest.raises(UploadError, match="wrong header"):
        dec(tensors, {})
    with pytest.raises(UploadError, match="packed codes have shape"):
        dec({**tensors, "codes": tensors["codes"][:-1]}, meta)
    with pytest.raises(UploadError, match="'scale' has shape"):
        dec({**tensors, "scale": tensors["scale"][:-1]}, meta)
    with pytest.raises(UploadError, match="finite"):
        dec({**tensors, "scale": -tensors["scale"]}, meta)
    bad = tensors["codes"].clone()
    bad[0] = 0xFF  # code 15: out of range for 4 bits (0..14)
    with pytest.raises(UploadError, match="code 15 is out of range"):
        dec({**tensors, "codes": bad}, meta)
    with pytest.raises(UploadError, match="no 'codes'"):
        dec({"scale": tensors["scale"]}, meta)
    data = wire.encode(tensors, meta)
    with pytest.raises(UploadError, match="truncated"):
        wire.decode(data[:-3])


def test_malformed_sparse_updates_are_refused() -> None:
    x = _x(1000, dtype=torch.float32)
    top = TopK(0.01)
    tensors, meta = _msg(top, x)
    dec = lambda t, m: top.decode(t, m, 1000, torch.float32)  # noqa: E731
    assert meta["index_coding"] == "delta"
    with pytest.raises(UploadError, match="truncated index list"):
        dec({**tensors, "indices": torch.tensor([0x85], dtype=torch.uint8)}, meta)
    far = torch.from_numpy(varint_encode(np.array([0] + [1] * 8 + [992])))
    with pytest.raises(UploadError, match="index 1000 is out of range"):
        dec({**tensors, "indices": far}, meta)
    dup = torch.from_numpy(varint_encode(np.array([5, 1, 0, 1, 1, 1, 1, 1, 1, 1])))
    with pytest.raises(UploadError, match="repeat"):
        dec({**tensors, "indices": dup}, meta)
    with pytest.raises(UploadError, match="'values' has shape"):
        dec({**tensors, "values": tensors["values"][:-1]}, meta)
    with pytest.raises(UploadError, match="wrong header"):
        dec(tensors, {**meta, "codec": "randk"})
    rk = RandomK(0.01)
    rt, rm = _msg(rk, x)
    with pytest.raises(UploadError, match="'values' has shape"):
        rk.decode({"values": rt["values"][:5]}, rm, 1000, torch.float32, CodecContext(0, 0, 0))

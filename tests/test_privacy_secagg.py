"""Secure aggregation and its laws: Shamir (any t shares reconstruct, t - 1 are
uniform), masks cancel exactly with dropouts at every phase, a masked update
is unrecoverable without t shares, the modulus cannot wrap; and the pipeline
refuses orders that cannot work."""

from __future__ import annotations

import numpy as np
import pytest

from fedforge.aggregation.mean import WeightedMean
from fedforge.core.errors import ConfigError
from fedforge.pipeline.clip import Clip
from fedforge.pipeline.constraints import ShowsOnlySum
from fedforge.pipeline.pipeline import Pipeline
from fedforge.privacy import shamir
from fedforge.privacy.dp import CentralNoise, DPMean, LocalNoise
from fedforge.privacy.secagg import PHASES, SecAggClient
from fedforge.privacy.secagg_masks import FixedPoint, modulus_bits
from fedforge.privacy.secagg_server import Simulated, secure_sum
from fedforge.robust import Median


def test_any_t_shares_reconstruct_and_t_minus_1_are_uniform() -> None:
    rng = np.random.default_rng(0)
    secret = 2**255 + 12345
    shares = shamir.split(secret, list(range(1, 8)), 4)
    for _ in range(10):
        pick = rng.choice(7, size=4, replace=False)
        assert shamir.reconstruct([shares[i] for i in pick]) == secret
    # t - 1 = 1 share of a degree-1 polynomial over GF(p) is uniform: over many
    # splits of two different secrets its top bit is 1 about half the time
    top = shamir.PRIME.bit_length() - 1
    for s in (0, secret):
        bits = [shamir.split(s, [1, 2], 2)[0][1] >> top for _ in range(2000)]
        assert abs(np.mean(bits) - 0.5) < 5 * 0.5 / np.sqrt(2000)


def _inputs(k: int, p: int, seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.uniform(-1, 1, p) / np.sqrt(p) for c in range(k)}


@pytest.mark.parametrize("phase", PHASES)
def test_masks_cancel_bit_for_bit_with_dropouts(phase: str) -> None:
    k, p, t = 7, 500, 4
    fp = FixedPoint(16, modulus_bits(1.0, k, 16))
    xs = _inputs(k, p, 1)
    drop = {int(c) for c in np.random.default_rng(PHASES.index(phase)).choice(k, 2, replace=False)}
    result = secure_sum(list(range(k)), p, t, fp, Simulated(xs, 2, t, fp), {phase: drop})
    assert result.total is not None, result.reason
    expect = sorted(set(range(k)) - drop) if phase != "unmask" else list(range(k))
    assert result.survivors == expect
    plain = np.zeros(p, dtype=np.uint64)
    for c in expect:
        plain = plain + fp.encode(xs[c])
    assert np.array_equal(result.total, plain & fp.mask)
    # quantisation: each input rounds to 2^-(f+1) at most
    err = np.abs(fp.decode(result.total) - sum(xs[c] for c in expect)).max()
    assert err <= len(expect) * 2.0**-17


def test_too_few_survivors_end_the_round_with_a_reason() -> None:
    fp = FixedPoint(16, modulus_bits(1.0, 5, 16))
    xs = _inputs(5, 10, 2)
    result = secure_sum(list(range(5)), 10, 4, fp, Simulated(xs, 0, 4, fp), {"unmask": {0, 1}})
    assert result.total is None and "fewer than t = 4" in (result.reason or "")


def test_a_threshold_just_above_half_still_needs_a_majority() -> None:
    from fedforge.privacy.secagg_graph import min_survivors

    for n in (2, 4, 6, 10):  # ceil(0.5000000001 n - 1e-9) was n / 2
        assert min_survivors(0.5000000001, n) == n // 2 + 1
    assert min_survivors(0.66, 10) == 7 and min_survivors(1.0, 3) == 3


@pytest.mark.parametrize("bits", [63, 64, 20])
def test_fixed_point_round_trips_at_every_modulus(bits: int) -> None:
    """k = 63 overflowed int64 (1 << 63) and crashed the first round's decode."""
    fp = FixedPoint(10, bits)
    x = np.array([-3.5, -(2.0**-10), 0.0, 2.0**-10, 7.25, -(2.0 ** min(bits - 12, 40))])
    total = (fp.encode(x) + fp.encode(x)) & fp.mask  # a sum of two inputs, mod 2^k
    assert np.array_equal(fp.decode(total), 2 * x)


def test_secure_sum_needs_its_round() -> None:
    fp = FixedPoint(16, modulus_bits(1.0, 4, 16))
    sim = Simulated(_inputs(4, 10, 0), 3, 3, fp)
    with pytest.raises(ValueError, match="needs the round"):
        secure_sum(list(range(4)), 10, 3, fp, lambda *a: sim(*a), {"unmask": {0}})


def test_a_masked_update_alone_reveals_nothing_without_t_shares() -> None:
    fp = FixedPoint(16, modulus_bits(1.0, 4, 16))
    xs = _inputs(4, 2000, 3)
    sim = Simulated(xs, 0, 3, fp)
    ys: dict[int, np.ndarray] = {}

    def spy(phase: str, c: int, msg: object) -> object:
        out = sim(phase, c, msg)
        if phase == "masked_input":
            ys[c] = out  # type: ignore[assignment]
        return out

    secure_sum(list(range(4)), 2000, 3, fp, spy, round_idx=0)
    y0 = fp.decode(ys[0])  # what the server holds of client 0 without unmasking
    assert np.corrcoef(y0, xs[0])[0, 1] ** 2 < 0.01
    # a client's own share (one point, fewer than t) is not its self-mask seed
    client = SecAggClient(9, 0, 3, fp)
    keys = {i: SecAggClient(i, 0, 3, fp).advertise() for i in range(3)} | {9: client.advertise()}
    client.share_keys(keys)
    assert client.own[0] != int.from_bytes(client.b, "big")


def test_modulus_is_sized_so_the_sum_cannot_wrap() -> None:
    k = modulus_bits(2.0, 100, 20)
    fp = FixedPoint(20, k)
    worst = sum(fp.encode(np.full(3, 2.0)) for _ in range(100)) & fp.mask
    assert np.allclose(fp.decode(worst), 200.0)
    worst = sum(fp.encode(np.full(3, -2.0)) for _ in range(100)) & fp.mask
    assert np.allclose(fp.decode(worst), -200.0)
    with pytest.raises(ConfigError, match="64"):
        modulus_bits(1e9, 10_000, 40)


class _SecAggCodecStub:
    name = "secagg"
    linear = True
    lossy = True
    constraints = (ShowsOnlySum(),)


def test_order_violating_pipelines_are_refused() -> None:
    clip, noise = Clip(1.0), LocalNoise(1.0, 1.0)
    with pytest.raises(ConfigError, match="before 'clip'"):
        Pipeline(WeightedMean(), client=(noise, clip))
    with pytest.raises(ConfigError, match="no client stage clips"):
        Pipeline(DPMean(1.0), server_aggregate=(CentralNoise(1.0, 1.0, 1.0),))
    with pytest.raises(ConfigError, match="weight cap"):
        Pipeline(WeightedMean(), client=(clip,), server_aggregate=(CentralNoise(1.0, 1.0, 1.0),))
    with pytest.raises(ConfigError, match="needs individual updates"):
        Pipeline(Median(), client=(clip,), codec=_SecAggCodecStub())  # type: ignore[arg-type]
    Pipeline(DPMean(1.0), client=(clip,), server_aggregate=(CentralNoise(1.0, 1.0, 1.0),))


def _bitwise_pack(words: np.ndarray, bits: int) -> np.ndarray:
    """A second packing, bit by bit: each word's low ``bits`` bits, first word first."""
    raw = words.astype("<u8").view(np.uint8).reshape(-1, 8)
    stream = np.unpackbits(raw, axis=1, bitorder="little")[:, :bits]
    return np.packbits(stream.reshape(-1), bitorder="little")


@pytest.mark.parametrize("bits", [1, 7, 8, 23, 25, 32, 33, 57, 63, 64])
def test_masked_words_pack_at_k_bits_and_refuse_padding(bits: int) -> None:
    from fedforge.core.errors import UploadError
    from fedforge.privacy.words import pack_words, unpack_words

    rng = np.random.default_rng(bits)
    for n in (1, 3, 8, 9, 1001):
        words = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2)
        words = (words + rng.integers(0, 2, n, dtype=np.uint64)) & FixedPoint(0, bits).mask
        packed = pack_words(words, bits)
        assert packed.size == (n * bits + 7) // 8
        assert np.array_equal(packed, _bitwise_pack(words, bits))
        assert np.array_equal(unpack_words(packed, bits, n), words)
        if (n * bits) % 8:
            bad = packed.copy()
            bad[-1] |= np.uint8(0x80)
            with pytest.raises(UploadError, match="padding"):
                unpack_words(bad, bits, n)

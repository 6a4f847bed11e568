"""Error feedback conserves mass, clipping bounds the norm, and the communication
config refuses what cannot work with a message naming the field."""

from __future__ import annotations

import pytest
import torch

from fedforge.communication.feedback import ErrorFeedback
from fedforge.communication.quantize import Quantize
from fedforge.communication.sparsify import RandomK, TopK
from fedforge.config import Config, from_dict
from fedforge.core.errors import ConfigError
from fedforge.pipeline.clip import Clip
from fedforge.pipeline.codec import CodecContext
from fedforge.pipeline.pipeline import Codec, StageContext
from fedforge.store import MemoryStateStore

F64 = torch.float64


def _deltas(rounds: int, size: int, dyadic: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    out = []
    for _ in range(rounds):
        d = torch.randn(size, generator=gen, dtype=F64)
        out.append(torch.round(d * 1024) / 1024 if dyadic else d)  # few bits: exact sums
    return out


def _run_ef(
    codec: Codec, deltas: list[torch.Tensor], client: int = 3
) -> tuple[torch.Tensor, torch.Tensor, MemoryStateStore]:
    store = MemoryStateStore(5, deltas[0].numel(), F64)
    ef = ErrorFeedback(codec, store)
    sent = torch.zeros_like(deltas[0])
    for r, d in enumerate(deltas):
        ctx = CodecContext(0, r, client)
        tensors, meta = ef.encode(d, ctx)
        sent += ef.decode(tensors, meta, d.numel(), F64, ctx)
    return sent, store.gather([client])[0], store


@pytest.mark.parametrize("codec", [TopK(0.05), RandomK(0.05)], ids=["topk", "randk"])
def test_error_feedback_conserves_mass_exactly(codec: Codec) -> None:
    deltas = _deltas(12, 400, dyadic=True)
    sent, residual, store = _run_ef(codec, deltas)
    assert torch.equal(sent + residual, torch.stack(deltas).sum(0))
    assert store.written() == [3]  # only this client's row
    assert float(residual.abs().sum()) > 0


@pytest.mark.parametrize("bits", [8, 2, 1])
def test_error_feedback_conserves_mass_for_quantizers(bits: int) -> None:
    deltas = _deltas(10, 300, dyadic=False)
    sent, residual, _ = _run_ef(Quantize(bits, stochastic=True, chunk=64), deltas)
    total = torch.stack(deltas).sum(0)
    assert torch.allclose(sent + residual, total, rtol=0, atol=1e-12)


def test_error_feedback_sends_what_was_dropped_next_time() -> None:
    d = torch.tensor([4.0, -3.0, 2.0, 1.0], dtype=F64)
    store = MemoryStateStore(1, 4, F64)
    ef = ErrorFeedback(TopK(0.25), store)  # one coordinate a round
    order = []
    for r in range(4):
        ctx = CodecContext(0, r, 0)
        tensors, meta = ef.encode(d if r == 0 else torch.zeros(4, dtype=F64), ctx)
        order.append(torch.nonzero(ef.decode(tensors, meta, 4, F64, ctx)).item())
    assert order == [0, 1, 2, 3]  # the residual drains, largest first
    assert torch.equal(store.gather([0])[0], torch.zeros(4, dtype=F64))


def test_a_diverged_update_keeps_the_old_residual() -> None:
    """A NaN or inf delta (local training blew up; the server refuses it) must not
    become the residual: it would poison every later update of the client."""
    store = MemoryStateStore(1, 4, F64)
    ef = ErrorFeedback(TopK(0.25), store)
    ef.encode(torch.tensor([4.0, -3.0, 2.0, 1.0], dtype=F64), CodecContext(0, 0, 0))
    kept = store.gather([0])[0].clone()
    assert torch.equal(kept, torch.tensor([0.0, -3.0, 2.0, 1.0], dtype=F64))
    for bad in (float("nan"), float("inf")):
        ef.encode(torch.tensor([1.0, bad, 0.0, 0.0], dtype=F64), CodecContext(0, 1, 0))
        assert torch.equal(store.gather([0])[0], kept)
    tensors, meta = ef.encode(torch.zeros(4, dtype=F64), CodecContext(0, 2, 0))
    assert torch.isfinite(ef.decode(tensors, meta, 4, F64, CodecContext(0, 2, 0))).all()


def test_error_feedback_needs_a_compressor_that_loses_less_than_its_input() -> None:
    """Stochastic sign with s = max|x| and stochastic 2 bits lose more than x in
    expectation (by hand: sign's E||C(x) - x||^2 = sum (s^2 - x_i^2)), so the
    residual grows without bound; nearest rounding (Karimireddy et al.'s scaled
    sign) loses less than x, and the residual stays bounded."""
    d = torch.randn(4096, generator=torch.Generator().manual_seed(0), dtype=F64) / 64
    s = float(d.abs().max())
    ratio = float((s**2 - d**2).sum() / (d**2).sum())
    assert ratio > 1  # the expected loss, larger than the input
    for uplink in ("sign", "int2"):
        from_dict(
            {"communication": {"uplink": uplink, "error_feedback": True, "rounding": "nearest"}}
        )
    store = MemoryStateStore(1, d.numel(), F64)
    ef = ErrorFeedback(Quantize(1, False, 1024), store)  # the nearest (scaled) sign
    for r in range(30):
        ef.encode(d, CodecContext(0, r, 0))
    assert float(store.gather([0])[0].norm()) < 5 * float(d.norm())


def test_error_feedback_keeps_its_residual_when_the_scale_is_not_finite() -> None:
    """A diverged update's int8 scale is NaN: decoding it on the client raised and
    ended the whole run; now the message goes (the server refuses it), the
    residual stays."""
    store = MemoryStateStore(1, 8, F64)
    ef = ErrorFeedback(Quantize(8, True, 1024), store)
    tensors, meta = ef.encode(torch.full((8,), float("nan"), dtype=F64), CodecContext(0, 0, 0))
    assert not store.has(0) and tensors


def test_clip_bounds_the_norm_and_keeps_small_deltas() -> None:
    clip = Clip(2.0)
    ctx = StageContext(0, 0, 1)
    big = torch.tensor([3.0, 4.0], dtype=F64)
    assert torch.allclose(clip.apply(big, ctx), torch.tensor([1.2, 1.6], dtype=F64))
    small = torch.tensor([0.3, 0.4], dtype=F64)
    assert clip.apply(small, ctx) is small
    with pytest.raises(ValueError, match="clip_norm"):
        Clip(0.0)


def test_communication_config_defaults_and_errors() -> None:
    com = Config().communication
    assert (com.uplink, com.downlink, com.error_feedback, com.upload_every, com.groups) == (
        "dense",
        "dense",
        False,
        1,
        0,
    )
    cfg = from_dict({"communication": {"uplink": "topk", "fraction": "1e-3"}})
    assert cfg.communication.fraction == 0.001
    bad = [
        ({"uplink": "int3"}, "'communication.uplink' = 'int3'.*registered codec: 'dense'"),
        ({"downlink": "topk"}, "'communication.downlink' = 'topk'"),
        ({"error_feedback": True}, "'communication.error_feedback' = True.*lossy uplink"),
        ({"uplink": "topk", "fraction": 0.0}, "'communication.fraction' = 0.0"),
        ({"upload_every": 0}, "'communication.upload_every' = 0"),
        ({"groups": 101}, r"'communication.groups' = 101.*1\.\.num_clients \(100\)"),
        ({"clip_norm": -1}, "'communication.clip_norm' = -1"),
        ({"chunk_size": 0}, "'communication.chunk_size' = 0"),
        ({"uplnk": "int8"}, "did you mean 'communication.uplink'"),
        ({"uplink": "sign", "error_feedback": True}, "needs rounding: nearest"),
        ({"uplink": "int2", "error_feedback": True}, "needs rounding: nearest"),
    ]
    for section, message in bad:
        with pytest.raises(ConfigError, match=message):
            from_dict({"communication": section})

"""Tests of the wire format: round trips, exact sizes, and rejection of malformed messages."""

from __future__ import annotations

import json
import struct
import time

import pytest
import torch

from fedforge.core.errors import UploadError
from fedforge.core.wire import DTYPES, MAGIC, Message, decode, encode, encoded_size


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)


def _frame(header: object, body: bytes = b"") -> bytes:
    """A message with a hand-written header (no validation on this side)."""
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return MAGIC + struct.pack("<I", len(raw)) + raw + body


def _entry(name: str, dtype: str, shape: list[int], offset: int, nbytes: int) -> dict:
    return {"name": name, "dtype": dtype, "shape": shape, "offset": offset, "nbytes": nbytes}


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (3, 0, 2), (1, 1, 1, 4)])
def test_round_trip_every_dtype_and_shape(dtype_name: str, shape: tuple[int, ...]) -> None:
    tensor = _sample(DTYPES[dtype_name], shape)
    msg = decode(encode({"x": tensor}, {"round_idx": 3}))
    out = msg.tensors["x"]
    assert out.dtype == tensor.dtype and out.shape == tensor.shape
    assert torch.equal(out, tensor)
    assert msg.meta == {"round_idx": 3}


def test_mixed_tensors_keep_order_values_and_meta() -> None:
    tensors = {
        "mask": torch.tensor([True, False, True]),  # 3 bytes: the next tensor is misaligned
        "w": torch.randn(4, 5),
        "b": torch.randn(5, dtype=torch.float64),
        "step": torch.tensor(7, dtype=torch.int64),
        "half": torch.randn(3).to(torch.bfloat16),
    }
    meta = {"client_id": 12, "num_examples": 600, "note": "héllo", "nested": {"a": [1, 2.5]}}
    msg = decode(encode(tensors, meta))
    assert list(msg.tensors) == list(tensors)
    for name, tensor in tensors.items():
        assert torch.equal(msg.tensors[name], tensor)
    assert msg.meta == meta


def test_exact_size_formula() -> None:
    p = 1000
    tensors = {"params": torch.zeros(p), "ids": torch.zeros(3, dtype=torch.int16)}
    meta = {"round_idx": 1}
    data = encode(tensors, meta)
    header_len = struct.unpack_from("<I", data, 4)[0]
    assert len(data) == 8 + header_len + 4 * p + 2 * 3
    assert encoded_size(tensors, meta) == len(data)
    assert encoded_size({}, None) == len(encode({}))
    # the header is small: a float32 vector costs 4P plus well under 200 bytes
    assert len(encode({"params": torch.zeros(p)})) - 4 * p < 200


def test_layout_is_little_endian_and_contiguous() -> None:
    data = encode({"a": torch.tensor([1, 2], dtype=torch.int32), "b": torch.tensor([1.5])})
    header_len = struct.unpack_from("<I", data, 4)[0]
    header = json.loads(data[8 : 8 + header_len])
    assert header["tensors"] == [
        _entry("a", "int32", [2], 0, 8),
        _entry("b", "float32", [1], 8, 4),
    ]
    body = data[8 + header_len :]
    assert body == struct.pack("<iif", 1, 2, 1.5)


def test_encode_handles_views_and_grad_tensors() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = base.t()  # not contiguous
    grad = torch.randn(3, requires_grad=True)
    msg = decode(encode({"v": view, "g": grad}))
    assert torch.equal(msg.tensors["v"], view)
    assert torch.equal(msg.tensors["g"], grad.detach())


def test_decoded_tensors_own_their_memory() -> None:
    data = bytearray(encode({"x": torch.arange(4, dtype=torch.float32)}))
    msg = decode(data)
    data[-4:] = b"\xff" * 4  # scribbling over the input must not change the tensor
    assert torch.equal(msg.tensors["x"], torch.arange(4, dtype=torch.float32))
    msg.tensors["x"] += 1  # and the tensor is writable
    assert isinstance(msg, Message)


def test_large_vector_is_fast() -> None:
    vec = torch.randn(1_663_370)
    encode({"p": vec})  # warm up
    start = time.perf_counter()
    data = encode({"p": vec})
    msg = decode(data)
    assert time.perf_counter() - start < 0.5
    assert len(data) - 4 * vec.numel() < 128
    assert torch.equal(msg.tensors["p"], vec)


def test_encode_refuses_bad_input() -> None:
    with pytest.raises(UploadError, match="complex64"):
        encode({"z": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(UploadError, match="JSON"):
        encode({}, {"x": float("nan")})
    with pytest.raises(UploadError, match="JSON"):
        encode({}, {"x": object()})


def test_every_truncation_is_rejected() -> None:
    data = encode({"a": torch.arange(3, dtype=torch.int16), "b": torch.ones(2)}, {"k": 1})
    for cut in range(len(data)):
        with pytest.raises(UploadError, match="truncated|bad magic|not JSON"):
            decode(data[:cut])


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"XXXX" + struct.pack("<I", 2) + b"{}", "bad magic"),
        (b"FFW", "truncated header"),
        (MAGIC + struct.pack("<I", 100) + b"{}", "truncated header"),
        (_frame(b"{not json"), "not JSON"),
        (_frame(b"\xff\xfe"), "not JSON"),
        (_frame(b'{"meta":{"x":NaN},"tensors":[]}'), "not JSON"),
        (_frame([1, 2]), "exactly the keys"),
        (_frame({"meta": [], "tensors": []}), "'meta' must be a JSON object"),
        (_frame({"meta": {}, "tensors": {}}), "'tensors' must be a JSON list"),
        (_frame({"meta": {}, "tensors": [{"name": "x"}]}), "exactly the keys"),
        (_frame({"meta": {}, "tensors": [_entry("x", "complex64", [1], 0, 8)]}), "unknown dtype"),
        (_frame({"meta": {}, "tensors": [_entry("x", "float32", [-1], 0, 4)]}), "invalid shape"),
        (_frame({"meta": {}, "tensors": [_entry("x", "float32", [1.0], 0, 4)]}), "invalid shape"),
        (_frame({"meta": {}, "tensors": [_entry("x", "float32", [2], -4, 8)]}), "invalid offset"),
        # empty (no bytes), but its strides would overflow int64
        (_frame({"meta": {}, "tensors": [_entry("x", "float32", [0, 10**20], 0, 0)]}), "2\\^62"),
        (_frame({"meta": {}, "tensors": [_entry("x", "float32", [0, 2**62, 4], 0, 0)]}), "2\\^62"),
        (
            _frame({"meta": {}, "tensors": [_entry("x", "float32", [2], 0, 4)]}, b"\0" * 4),
            "nbytes mismatch",
        ),
        (
            _frame({"meta": {}, "tensors": [_entry("x", "float32", [2], 0, 8)]}, b"\0" * 4),
            "truncated body",
        ),
        (
            _frame({"meta": {}, "tensors": [_entry("x", "float32", [1], 0, 4)]}, b"\0" * 5),
            "trailing bytes",
        ),
        (_frame({"meta": {}, "tensors": []}, b"\0"), "trailing bytes"),
        (
            _frame(
                {
                    "meta": {},
                    "tensors": [
                        _entry("a", "float32", [1], 0, 4),
                        _entry("b", "float32", [1], 0, 4),
                    ],
                },
                b"\0" * 8,
            ),
            "overlaps",
        ),
        (
            _frame({"meta": {}, "tensors": [_entry("a", "float32", [1], 4, 4)]}, b"\0" * 4),
            "out of range",
        ),
        (
            _frame(
                {
                    "meta": {},
                    "tensors": [_entry("a", "uint8", [2], 0, 2), _entry("b", "uint8", [2], 4, 2)],
                },
                b"\0" * 4,
            ),
            "out of range",
        ),
        (
            _frame(
                {
                    "meta": {},
                    "tensors": [_entry("a", "uint8", [2], 2, 2), _entry("b", "uint8", [2], 0, 2)],
                },
                b"\0" * 4,
            ),
            "gap",
        ),
        (
            _frame(
                {
                    "meta": {},
                    "tensors": [_entry("a", "uint8", [1], 0, 1), _entry("a", "uint8", [1], 1, 1)],
                },
                b"\0" * 2,
            ),
            "more than once",
        ),
        (
            _frame({"meta": {}, "tensors": [_entry("m", "bool", [2], 0, 2)]}, b"\x01\x02"),
            "bool",
        ),
    ],
)
def test_malformed_messages_are_rejected(message: bytes, reason: str) -> None:
    with pytest.raises(UploadError, match=reason):
        decode(message)


def test_flipped_header_length_never_returns_garbage() -> None:
    data = bytearray(encode({"a": torch.arange(4, dtype=torch.int32)}, {"k": "v"}))
    for length in range(0, len(data)):
        bad = bytearray(data)
        bad[4:8] = struct.pack("<I", length)
        if bytes(bad) == bytes(data):
            continue
        with pytest.raises(UploadError):
            decode(bytes(bad))

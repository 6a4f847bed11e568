"""The wire format for payloads (server -> client) and updates (client -> server).

Layout of one message::

    b"FFW1" | uint32 LE header length | JSON header | tensor bytes (little-endian, contiguous)

The header is compact UTF-8 JSON
``{"meta": {...}, "tensors": [{"name", "dtype", "shape", "offset", "nbytes"}, ...]}``;
``offset`` counts from the first byte after the header, tensors follow each other in
header order with no gaps. A float32 vector of P parameters costs 4P bytes plus the
header. :func:`decode` trusts nothing: every malformed message raises
:class:`~fedforge.core.errors.UploadError` naming the reason, never a half-read result.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fedforge.core.errors import UploadError

MAGIC = b"FFW1"
PREFIX_SIZE = len(MAGIC) + 4  # magic + uint32 header length
_HEADER_LEN = struct.Struct("<I")

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
_NAMES: dict[torch.dtype, str] = {dt: name for name, dt in DTYPES.items()}
_ENTRY_KEYS = frozenset({"name", "dtype", "shape", "offset", "nbytes"})
_BIG_ENDIAN = sys.byteorder == "big"
# A shape's strides (the products of its trailing dimensions, an empty one
# counting as 1) must fit torch's int64: an empty tensor [0, 10**20] has no bytes
# but cannot be made.
_MAX_SPAN = 2**62


@dataclass(frozen=True)
class Message:
    """A decoded message: named tensors (owning their memory) and JSON metadata."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]


def _bad(reason: str) -> UploadError:
    return UploadError(f"malformed message: {reason}")


def _prepare(
    tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any] | None
) -> tuple[bytes, list[torch.Tensor]]:
    """The encoded header and the CPU, contiguous tensors it describes, in order."""
    entries: list[dict[str, Any]] = []
    flat: list[torch.Tensor] = []
    offset = 0
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise UploadError(f"tensor name {name!r} must be a string")
        if not isinstance(tensor, torch.Tensor):
            raise UploadError(f"tensor '{name}' is a {type(tensor).__name__}, not a torch.Tensor")
        dtype = _NAMES.get(tensor.dtype)
        if dtype is None:
            raise UploadError(
                f"tensor '{name}' has dtype {tensor.dtype}, not allowed on the wire; "
                f"allowed: {', '.join(DTYPES)}"
            )
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(
            {
                "name": name,
                "dtype": dtype,
                "shape": list(tensor.shape),
                "offset": offset,
                "nbytes": nbytes,
            }
        )
        flat.append(tensor.detach().to("cpu").contiguous().reshape(-1))
        offset += nbytes
    try:
        header = json.dumps(
            {"meta": dict(meta or {}), "tensors": entries},
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise UploadError(f"message meta cannot be encoded as strict JSON: {exc}") from None
    if len(header) >= 2**32:
        raise UploadError(f"message header of {len(header)} bytes exceeds the 4 GiB limit")
    return header, flat


def _raw(tensor: torch.Tensor) -> memoryview:
    """The little-endian bytes of a flat contiguous CPU tensor, without copying."""
    raw = tensor.view(torch.uint8)
    if _BIG_ENDIAN and tensor.element_size() > 1:
        raw = raw.reshape(-1, tensor.element_size()).flip(1).reshape(-1)
    return raw.numpy().data.cast("B")


def encode(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any] | None = None) -> bytes:
    """Encode named tensors and JSON-able ``meta`` into one message (a single copy)."""
    header, flat = _prepare(tensors, meta)
    parts: list[bytes | memoryview] = [MAGIC, _HEADER_LEN.pack(len(header)), header]
    parts.extend(_raw(t) for t in flat if t.numel() > 0)
    return b"".join(parts)


def encoded_size(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any] | None = None) -> int:
    """``len(encode(tensors, meta))``, computed without copying any tensor data."""
    header, flat = _prepare(tensors, meta)
    return PREFIX_SIZE + len(header) + sum(t.numel() * t.element_size() for t in flat)


# ----------------------------------------------------------------------------- decoding


def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-standard JSON constant {token}")


def _nonneg_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entry(index: int, entry: Any) -> tuple[str, torch.dtype, list[int], int, int]:
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        raise _bad(
            f"header entry {index} must be an object with exactly the keys "
            f"{sorted(_ENTRY_KEYS)}, got {entry!r:.200}"
        )
    name, dtype_name, shape = entry["name"], entry["dtype"], entry["shape"]
    offset, nbytes = entry["offset"], entry["nbytes"]
    if not isinstance(name, str):
        raise _bad(f"header entry {index} has a non-string name {name!r:.100}")
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise _bad(
            f"tensor '{name}' has unknown dtype {dtype_name!r:.100}; allowed: {', '.join(DTYPES)}"
        )
    if not isinstance(shape, list) or not all(_nonneg_int(d) for d in shape):
        raise _bad(f"tensor '{name}' has an invalid shape {shape!r:.100}")
    if math.prod(max(d, 1) for d in shape) > _MAX_SPAN:
        raise _bad(f"tensor '{name}' has a shape {shape!r:.100} spanning more than 2^62 elements")
    if not _nonneg_int(offset) or not _nonneg_int(nbytes):
        raise _bad(f"tensor '{name}' has invalid offset/nbytes {offset!r:.40}/{nbytes!r:.40}")
    dtype = DTYPES[dtype_name]
    expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes != expected:
        raise _bad(
            f"tensor '{name}' nbytes mismatch: header says {nbytes}, "
            f"but shape {shape} of {dtype_name} needs {expected}"
        )
    return name, dtype, shape, offset, nbytes


def _parse_header(data: memoryview) -> tuple[dict[str, Any], list[Any], int]:
    """Validate the prefix and header; return meta, tensor entries and body start."""
    if len(data) < len(MAGIC) and bytes(data) != MAGIC[: len(data)]:
        raise _bad(f"bad magic {bytes(data)!r}, expected {MAGIC!r}")
    if len(data) < PREFIX_SIZE:
        raise _bad(f"truncated header: {len(data)} bytes, the prefix alone needs {PREFIX_SIZE}")
    if bytes(data[: len(MAGIC)]) != MAGIC:
        raise _bad(f"bad magic {bytes(data[: len(MAGIC)])!r}, expected {MAGIC!r}")
    (header_len,) = _HEADER_LEN.unpack_from(data, len(MAGIC))
    body_start = PREFIX_SIZE + header_len
    if body_start > len(data):
        raise _bad(
            f"truncated header: header length is {header_len} bytes, "
            f"only {len(data) - PREFIX_SIZE} present"
        )
    try:
        header = json.loads(
            str(data[PREFIX_SIZE:body_start], "utf-8"), parse_constant=_reject_constant
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _bad(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or set(header) != {"meta", "tensors"}:
        raise _bad("header must be a JSON object with exactly the keys 'meta' and 'tensors'")
    meta, entries = header["meta"], header["tensors"]
    if not isinstance(meta, dict):
        raise _bad(f"header 'meta' must be a JSON object, not {type(meta).__name__}")
    if not isinstance(entries, list):
        raise _bad(f"header 'tensors' must be a JSON list, not {type(entries).__name__}")
    return meta, entries, body_start


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Decode and fully validate one message; raise :class:`UploadError` if malformed.

    The body is copied once into a buffer the returned tensors own, so they stay
    valid (and writable) whatever happens to ``data`` afterwards.
    """
    view = memoryview(data).cast("B")
    meta, raw_entries, body_start = _parse_header(view)
    entries = [_check_entry(i, e) for i, e in enumerate(raw_entries)]
    seen: set[str] = set()
    for entry in entries:
        if entry[0] in seen:
            raise _bad(f"tensor name '{entry[0]}' appears more than once")
        seen.add(entry[0])
    body_len = len(view) - body_start
    total = sum(e[4] for e in entries)
    if body_len < total:
        raise _bad(f"truncated body: header declares {total} tensor bytes, only {body_len} present")
    if body_len > total:
        raise _bad(f"{body_len - total} trailing bytes after the {total} declared tensor bytes")
    end = 0
    for name, _, _, offset, nbytes in entries:
        if offset + nbytes > body_len:
            raise _bad(
                f"tensor '{name}' bytes [{offset}, {offset + nbytes}) out of range "
                f"of the {body_len}-byte body"
            )
        if offset < end:
            raise _bad(f"tensor '{name}' at offset {offset} overlaps the previous tensor")
        if offset > end:
            raise _bad(f"tensor '{name}' at offset {offset} leaves a gap after byte {end}")
        end = offset + nbytes

    body = bytearray(view[body_start:])
    tensors: dict[str, torch.Tensor] = {}
    for name, dtype, shape, offset, nbytes in entries:
        tensors[name] = _tensor(body, dtype, shape, offset, nbytes, name)
    return Message(tensors=tensors, meta=meta)


def _tensor(
    body: bytearray, dtype: torch.dtype, shape: list[int], offset: int, nbytes: int, name: str
) -> torch.Tensor:
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(body, dtype=torch.uint8, count=nbytes, offset=offset)
    if dtype == torch.bool and bool((raw > 1).any()):
        raise _bad(f"bool tensor '{name}' holds bytes other than 0 and 1")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if _BIG_ENDIAN and itemsize > 1:
        raw = raw.reshape(-1, itemsize).flip(1).reshape(-1)
    elif offset % itemsize:  # misaligned for this dtype: give it its own storage
        raw = raw.clone()
    return raw.view(dtype).reshape(shape)

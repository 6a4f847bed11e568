"""Compact encodings that compressed updates travel in: b-bit codes packed into
bytes, LEB128 varints (as in Protocol Buffers' wire format) and sparse index
sets as delta-coded varints or a bitmap, whichever is smaller.

Packing puts ``8 // bits`` codes in a byte, the first in the lowest bits; a
message's last byte is padded with zero bits. Index gaps follow the index-list
compression of sparse gradient schemes (Aji & Heafield 2017, Lin et al. 2018
"Deep Gradient Compression"): sorted indices become the first index and then
the differences to the previous one, each as a varint, so a top-1% index set
of a 1.66M-parameter model costs about 1.2 bytes an index instead of 4.
Runs on both sides; every decoder refuses malformed input with an
:class:`~fedforge.core.errors.UploadError` naming the reason.
"""

from __future__ import annotations

import numpy as np
import torch

from fedforge.core.errors import UploadError, shown

PACK_BITS = (1, 2, 4, 8)
VARINT_MAX_BYTES = 5  # values below 2**35: every index of a model below 34 billion parameters
INDEX_CODINGS = ("delta", "bitmap")


def packed_size(count: int, bits: int) -> int:
    """Bytes that ``count`` codes of ``bits`` bits take when packed."""
    return (count * bits + 7) // 8


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes (each below ``2**bits``) packed ``8 // bits`` to a byte (uint8)."""
    if bits not in PACK_BITS:
        raise ValueError(f"cannot pack {bits}-bit codes; allowed: {PACK_BITS}")
    flat = codes.reshape(-1).to(torch.uint8)
    if bits == 8:
        return flat.clone()
    per = 8 // bits
    pad = (-flat.numel()) % per
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    shifts = torch.arange(per, dtype=torch.int32) * bits
    return (flat.view(-1, per).to(torch.int32) << shifts).sum(dim=1).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The ``count`` codes (uint8) of :func:`pack`; refuses a wrong length or
    padding bits that are not zero."""
    if packed.dtype != torch.uint8 or tuple(packed.shape) != (packed_size(count, bits),):
        raise UploadError(
            f"packed codes have shape {shown(tuple(packed.shape))} and dtype {packed.dtype}; "
            f"{count} codes of {bits} bits need ({packed_size(count, bits)},) torch.uint8"
        )
    if bits == 8:
        return packed
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32) * bits
    codes = ((packed.to(torch.int32).unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1)
    if bool(codes[count:].any()):
        raise UploadError("packed codes have non-zero padding bits after the last code")
    return codes[:count].to(torch.uint8)


# ----------------------------------------------------------------------------- varints


def varint_encode(values: np.ndarray) -> np.ndarray:
    """Non-negative integers as LEB128 varints: 7 bits a byte, low groups first,
    the high bit set on every byte but a number's last."""
    v = np.asarray(values, dtype=np.uint64)
    if v.size == 0:
        return np.zeros(0, dtype=np.uint8)
    nbytes = np.ones(v.shape, dtype=np.int64)
    for j in range(1, 10):
        nbytes += (v >> np.uint64(7 * j)) > 0
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    for j in range(int(nbytes.max())):
        sel = nbytes > j
        group = (v[sel] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = np.where(nbytes[sel] > j + 1, np.uint64(0x80), np.uint64(0))
        out[starts[sel] + j] = (group | more).astype(np.uint8)
    return out


def varint_size(values: np.ndarray) -> int:
    """``len(varint_encode(values))`` without encoding."""
    v = np.asarray(values, dtype=np.uint64)
    total = v.size
    for j in range(1, 10):
        total += int(((v >> np.uint64(7 * j)) > 0).sum())
    return int(total)


def varint_decode(data: np.ndarray, count: int) -> np.ndarray:
    """Exactly ``count`` varints from ``data`` (int64); refuses a truncated last
    number, a different count, numbers longer than 5 bytes and non-canonical
    encodings (a final byte of zero in a multi-byte number)."""
    data = np.asarray(data, dtype=np.uint8)
    if data.size == 0:
        if count:
            raise UploadError(f"index list is empty; expected {count} indices")
        return np.zeros(0, dtype=np.int64)
    last = (data & 0x80) == 0
    if not last[-1]:
        raise UploadError("truncated index list: its last varint has the continuation bit set")
    ends = np.flatnonzero(last)
    if len(ends) != count:
        raise UploadError(f"index list holds {len(ends)} indices; expected {count}")
    starts = np.concatenate([[0], ends[:-1] + 1])
    lengths = ends - starts + 1
    if int(lengths.max()) > VARINT_MAX_BYTES:
        raise UploadError(f"index varint longer than {VARINT_MAX_BYTES} bytes")
    if bool(((lengths > 1) & (data[ends] == 0)).any()):
        raise UploadError("index varint is not canonical (ends in a zero byte)")
    group = np.repeat(np.arange(count), lengths)
    position = np.arange(data.size) - starts[group]
    parts = (data & 0x7F).astype(np.float64) * np.exp2(7 * position)  # < 2**35: exact
    return np.bincount(group, weights=parts, minlength=count).astype(np.int64)


# ----------------------------------------------------------------------------- index sets


def _gaps(indices: np.ndarray) -> np.ndarray:
    """The first index, then each index minus the one before (>= 1 when sorted)."""
    return np.diff(indices, prepend=0) if indices.size else indices


def index_bytes(indices: torch.Tensor, size: int) -> tuple[int, str]:
    """Bytes and name of the smaller coding of sorted, distinct ``indices`` < ``size``."""
    delta = varint_size(_gaps(indices.numpy()))
    bitmap = packed_size(size, 1)
    return (bitmap, "bitmap") if bitmap < delta else (delta, "delta")


def encode_indices(indices: torch.Tensor, size: int) -> tuple[torch.Tensor, str]:
    """Sorted, distinct ``indices`` (int64) in the smaller of the two codings:
    ``delta`` (varint gaps) or ``bitmap`` (``ceil(size / 8)`` bytes, bit i set
    when i is an index). Returns the bytes (uint8) and the coding's name."""
    _, coding = index_bytes(indices, size)
    if coding == "bitmap":
        mask = torch.zeros(size, dtype=torch.uint8)
        mask[indices] = 1
        return pack(mask, 1), coding
    return torch.from_numpy(varint_encode(_gaps(indices.numpy()))), coding


def decode_indices(data: torch.Tensor, coding: object, count: int, size: int) -> torch.Tensor:
    """The ``count`` sorted, distinct indices below ``size`` that ``data`` codes;
    refuses anything else, naming the reason."""
    if data.dtype != torch.uint8 or data.ndim != 1:
        raise UploadError(f"indices must be a flat uint8 tensor, got {data.dtype} {data.ndim}-d")
    if coding == "bitmap":
        mask = unpack(data, 1, size)
        indices = torch.nonzero(mask).reshape(-1)
        if indices.numel() != count:
            raise UploadError(f"index bitmap marks {indices.numel()} indices; expected {count}")
        return indices
    if coding != "delta":
        raise UploadError(f"wrong header: index coding {coding!r:.40}; allowed: {INDEX_CODINGS}")
    gaps = varint_decode(data.numpy(), count)
    if count and bool((gaps[1:] == 0).any()):
        raise UploadError("indices repeat (a zero gap): each index may appear once")
    positions = np.cumsum(gaps)
    if count and int(positions[-1]) >= size:
        raise UploadError(f"index {int(positions[-1])} is out of range for {size} parameters")
    return torch.from_numpy(positions)

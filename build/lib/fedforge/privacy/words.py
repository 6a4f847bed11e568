"""k-bit words on the wire: a secure-aggregation masked update is a vector of
integers mod 2^k, sent as a little-endian bit stream of exactly k bits a word
(the first word in the lowest bits, the last byte padded with zeros), so its
bytes are the modulus's, not a machine word's. Runs on both sides; the reader
refuses non-zero padding."""

from __future__ import annotations

import numpy as np

from fedforge.core.errors import UploadError


def pack_words(words: np.ndarray, bits: int) -> np.ndarray:
    """uint64 words below 2^bits as a little-endian bit stream, ``bits`` a word
    (the first word in the lowest bits; the last byte padded with zeros).

    Eight words fill exactly ``bits`` bytes. For 8 <= bits <= 57 word j of every
    group, shifted by its bit offset, fits one little-endian 8-byte window at a
    fixed byte offset of the group: eight strided ORs (measured for the CNN's 1.66M
    words at 25 bits: pack 0.07 s, unpack 0.06 s, against 0.9 s and 0.2 s
    expanding every bit). Other widths go byte column by byte column."""
    count = words.size
    groups = _grouped(words.astype(np.uint64, copy=False), count)
    if not WINDOW_BITS[0] <= bits <= WINDOW_BITS[1]:
        return _pack_columns(groups, bits)[: (count * bits + 7) // 8]
    stream = np.zeros(groups.shape[0] * bits + 8, dtype=np.uint8)
    for j in range(8):
        start, shift = divmod(j * bits, 8)
        window = _windows(stream, start, bits, groups.shape[0])
        shifted = (groups[:, j] << np.uint64(shift)).astype("<u8")
        np.bitwise_or(window, shifted.view(np.uint8).reshape(-1, 8), out=window)
    return stream[: (count * bits + 7) // 8].copy()


def unpack_words(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The inverse of :func:`pack_words`; refuses non-zero padding."""
    groups = -(-count // 8)
    if WINDOW_BITS[0] <= bits <= WINDOW_BITS[1]:
        stream = np.zeros(groups * bits + 8, dtype=np.uint8)
        stream[: packed.size] = packed
        words = np.empty((groups, 8), dtype=np.uint64)
        for j in range(8):
            start, shift = divmod(j * bits, 8)
            window = _windows(stream, start, bits, groups).copy().view("<u8")[:, 0]
            words[:, j] = window >> np.uint64(shift)
    else:
        words = _unpack_columns(packed, bits, groups)
    if bits < 64:
        words &= np.uint64((1 << bits) - 1)
    flat = words.reshape(-1)
    if flat[count:].any():  # the padding bits of the last byte belong to these words
        raise UploadError("masked update: non-zero padding bits after the last word")
    return flat[:count].copy()


WINDOW_BITS = (8, 57)  # widths whose words (shifted <= 7 bits) fit 8 bytes, windows disjoint


def _windows(stream: np.ndarray, start: int, bits: int, groups: int) -> np.ndarray:
    """The [groups, 8] byte windows at byte ``start`` of every group of ``bits`` bytes
    (a writable strided view; disjoint rows as bits >= 8)."""
    return np.lib.stride_tricks.as_strided(
        stream[start:], shape=(groups, 8), strides=(bits, 1), writeable=True
    )


def _pack_columns(groups: np.ndarray, bits: int) -> np.ndarray:
    columns = groups.T.copy()  # [8, groups]
    out = np.zeros((bits, columns.shape[1]), dtype=np.uint64)
    for j, b, shift in _overlaps(bits):
        part = columns[j] >> np.uint64(shift) if shift >= 0 else columns[j] << np.uint64(-shift)
        out[b] |= part & np.uint64(0xFF)
    return out.astype(np.uint8).T.reshape(-1)


def _unpack_columns(packed: np.ndarray, bits: int, groups: int) -> np.ndarray:
    stream = np.zeros(groups * bits, dtype=np.uint64)
    stream[: packed.size] = packed
    table = stream.reshape(groups, bits).T.copy()  # [bits, groups]
    words = np.zeros((8, groups), dtype=np.uint64)
    for j, b, shift in _overlaps(bits):
        part = table[b] << np.uint64(shift) if shift >= 0 else table[b] >> np.uint64(-shift)
        words[j] |= part
    return words.T.copy()


def _grouped(words: np.ndarray, count: int) -> np.ndarray:
    """The words as rows of eight, zero-padded."""
    padded = np.zeros(-(-count // 8) * 8, dtype=np.uint64)
    padded[:count] = words
    return padded.reshape(-1, 8)


def _overlaps(bits: int) -> list[tuple[int, int, int]]:
    """(word j, byte b, shift) for every word and byte of a group of eight that share
    bits: byte b holds (word j >> shift) & 0xFF; a negative shift is a left shift."""
    pairs = []
    for j in range(8):
        first, last = j * bits, (j + 1) * bits - 1  # the word's bits in the group
        for b in range(first // 8, last // 8 + 1):
            pairs.append((j, b, 8 * b - first))
    return pairs

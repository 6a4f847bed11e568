"""Secure aggregation's phase messages on the wire (Bonawitz et al. 2017; SecAgg+,
Bell et al. 2020): the server's builders (``*_message``) and its parsers of the
clients' replies (``read_*``, which trust nothing and raise
:class:`~fedforge.core.errors.UploadError`), and the helpers the client's codec
(``secagg_codec.py``) reads and writes its side with. Every message is a real
wire message (``core/wire.py``), so the bytes counted are the bytes a
deployment would send. Runs on both sides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedforge.core import wire
from fedforge.core.errors import UploadError
from fedforge.pipeline.codec import expect_tensor
from fedforge.privacy import shamir
from fedforge.privacy.secagg_masks import CIPHERTEXT_BYTES, KEY_BYTES, SHARE_BYTES, agreeable

ABORT = "abort"  # the meta key of a client's abort note


def meta_of(phase: str, round_idx: int, client_id: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"phase": phase, "round_idx": round_idx}
    return meta if client_id is None else {**meta, "client_id": client_id}


def id_tensor(ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(ids), dtype=torch.int64)


def rows(blobs: Sequence[bytes], width: int) -> torch.Tensor:
    if not blobs:
        return torch.zeros((0, width), dtype=torch.uint8)
    return torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8).reshape(-1, width)


def _read(data: bytes, phase: str, round_idx: int, client_id: int | None) -> wire.Message:
    msg = wire.decode(data)
    want = meta_of(phase, round_idx, client_id)
    got = {k: msg.meta.get(k) for k in want}
    if got != want:
        raise UploadError(f"secure aggregation: message labelled {got!r:.200}; expected {want}")
    if ABORT in msg.meta:  # the client stopped: a dropout, with its reason
        raise UploadError(f"secure aggregation: {msg.meta[ABORT]!s:.300} (at '{phase}')")
    return msg


def abort_message(phase: str, round_idx: int, client_id: int, why: str) -> bytes:
    """A client's answer when it aborts the round: why, and nothing else."""
    return wire.encode({}, {**meta_of(phase, round_idx, client_id), ABORT: why})


def ids_of(msg: wire.Message, name: str) -> list[int]:
    """The distinct client ids of tensor ``name`` (1-D int64)."""
    t = msg.tensors.get(name)
    if t is None or t.dtype != torch.int64 or t.ndim != 1:
        raise UploadError(f"secure aggregation: a message without its '{name}' list")
    return id_list(t)


def id_list(t: torch.Tensor, allowed: Sequence[int] | None = None) -> list[int]:
    ids = [int(v) for v in t.tolist()]
    if len(set(ids)) != len(ids) or (allowed is not None and not set(ids) <= set(allowed)):
        raise UploadError("secure aggregation: repeated or unknown client ids in a message")
    return ids


def advertise_message(round_idx: int, cohort: Sequence[int] | None = None) -> bytes:
    """SecAgg+: with the round's cohort, from which the client derives the graph."""
    tensors = {} if cohort is None else {"cohort": id_tensor(sorted(cohort))}
    return wire.encode(tensors, meta_of("advertise", round_idx))


def share_keys_message(
    round_idx: int, keys: Mapping[int, tuple[bytes, bytes]], threshold: int
) -> bytes:
    """U1, each client's two public keys (channel, mask) and the threshold t."""
    ids = sorted(keys)
    tensors = {"ids": id_tensor(ids), "keys": rows([keys[c][0] + keys[c][1] for c in ids], 64)}
    return wire.encode(tensors, {**meta_of("share_keys", round_idx), "threshold": threshold})


def masked_input_message(round_idx: int, routed: Mapping[int, bytes], u2: Sequence[int]) -> bytes:
    """U2 and the ciphertexts the other clients of U2 sent this client."""
    senders = sorted(routed)
    tensors = {
        "u2": id_tensor(u2),
        "from": id_tensor(senders),
        "ct": rows([routed[i] for i in senders], CIPHERTEXT_BYTES),
    }
    return wire.encode(tensors, meta_of("masked_input", round_idx))


def unmask_message(round_idx: int, u3: Sequence[int]) -> bytes:
    return wire.encode({"u3": id_tensor(u3)}, meta_of("unmask", round_idx))


def read_keys(data: bytes, round_idx: int, client_id: int) -> tuple[bytes, bytes]:
    msg = _read(data, "advertise", round_idx, client_id)
    raw = expect_tensor(msg.tensors, "keys", (2 * KEY_BYTES,), torch.uint8).numpy().tobytes()
    keys = raw[:KEY_BYTES], raw[KEY_BYTES:]
    for what, key in zip(("channel", "mask"), keys, strict=True):
        if not agreeable(key):
            raise UploadError(
                f"secure aggregation: client {client_id}'s {what} key {key.hex()[:16]}... "
                "is a low-order X25519 point (no shared secret)"
            )
    return keys


def read_shares(data: bytes, round_idx: int, client_id: int, u1: Sequence[int]) -> dict[int, bytes]:
    """A client's ciphertexts, one for every other client of U1."""
    msg = _read(data, "share_keys", round_idx, client_id)
    to = msg.tensors.get("to")
    if to is None or to.dtype != torch.int64 or to.ndim != 1:
        raise UploadError("secure aggregation: shares without a 'to' list")
    ids = id_list(to, u1)
    if sorted(ids) != [c for c in sorted(u1) if c != client_id]:
        raise UploadError(f"secure aggregation: client {client_id} did not share with all of U1")
    ct = expect_tensor(msg.tensors, "ct", (len(ids), CIPHERTEXT_BYTES), torch.uint8).numpy()
    return {j: ct[r].tobytes() for r, j in enumerate(ids)}


def read_unmask(
    data: bytes, round_idx: int, client_id: int, u2: Sequence[int]
) -> dict[int, tuple[str, int]]:
    """A survivor's shares: b of the clients in U3, the mask key of the others."""
    msg = _read(data, "unmask", round_idx, client_id)
    got = msg.tensors.get("ids")
    if got is None or got.dtype != torch.int64 or got.ndim != 1:
        raise UploadError("secure aggregation: unmasking shares without an 'ids' list")
    ids = id_list(got, u2)
    kind = expect_tensor(msg.tensors, "kind", (len(ids),), torch.uint8).tolist()
    if any(k > 1 for k in kind):
        raise UploadError("secure aggregation: a share's kind must be 0 (mask key) or 1 (b)")
    raw = expect_tensor(msg.tensors, "shares", (len(ids), SHARE_BYTES), torch.uint8).numpy()
    shares = [int.from_bytes(row.tobytes(), "big") for row in raw]
    if any(y >= shamir.PRIME for y in shares):
        raise UploadError("secure aggregation: a share is not below the field's prime 2^521 - 1")
    return {j: ("b" if k else "s", y) for j, k, y in zip(ids, kind, shares, strict=True)}

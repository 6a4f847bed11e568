"""Secure aggregation in the round (Bonawitz et al. 2017): the client's last stage
and the phase messages, on the wire.

:class:`SecAggCodec` is the codec of a run with ``privacy.secagg``: it keeps each
client's :class:`~fedforge.privacy.secagg.SecAggClient` of the round, answers the
extra phases (advertise keys, share keys, receive the routed shares, unmask) and
encodes the clipped (and noised) delta as ``w_k x_k`` in fixed point plus masks,
k bits a word on the wire
(``w_k`` uniform 1 or ``min(n_k / cap, 1)``: the DP mean's weights; the server
divides the unmasked sum by a public total weight, :class:`SecAggMean`). Every
phase message is a real wire message (``transport/wire.py``), so the bytes
counted are the bytes a deployment would send. Runs on the client (``phase``,
``encode``) and the server (the ``*_message`` builders, ``read_*`` parsers, which
trust nothing and raise :class:`UploadError`). With ``neighbours`` = k it runs
SecAgg+ (Bell et al. 2020, ``secagg_graph.py``): the advertise message carries
the cohort, from which each client derives the round's graph (run seed, round)
and its neighbourhood; every later message holds only that neighbourhood.

A client that cannot take a phase message (a share that does not decrypt or is
mislabelled, a threshold below the run's, a malformed message) aborts the round,
as the paper's honest client does: it answers nothing and forgets its keys, and
the server sees a dropout. Only the message that precedes its masked update is
not abortable here (it carries nothing to check before unmasking).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from cryptography.exceptions import InvalidTag

from fedforge.aggregation.mean import Accumulator
from fedforge.core import wire
from fedforge.core.errors import ConfigError, UploadError
from fedforge.core.params import all_finite
from fedforge.pipeline.codec import CodecContext, expect_codec, expect_tensor
from fedforge.pipeline.constraints import ShowsOnlySum, Unusable
from fedforge.pipeline.pipeline import Constraint
from fedforge.privacy import shamir
from fedforge.privacy.secagg import SecAggClient
from fedforge.privacy.secagg_graph import MaskGraph, complete_graph, min_survivors, random_harary
from fedforge.privacy.secagg_masks import (
    CIPHERTEXT_BYTES,
    KEY_BYTES,
    SHARE_BYTES,
    FixedPoint,
    agreeable,
    modulus_bits,
)
from fedforge.privacy.words import pack_words, unpack_words

# Noise before the mask (local, tiered or distributed DP) has no hard bound, but
# the modulus needs one: the codec clamps each coordinate at C + 8 s (s the
# client's noise std; a clipped coordinate is within [-C, C]), sized into k. The
# clamp binds only where |noise| > 8 s: P = erfc(8 / sqrt 2) = 1.2e-15 a coordinate
# (``clamp_probability``), e.g. 2.4e-7 over a 100-round run of 10 clients of the
# 2NN (2e8 coordinates). A mechanism that differs from the Gaussian one only on
# an event of probability p is (epsilon, delta + p)-DP: a strict account adds p to
# delta; the reported epsilon treats the noise as unclamped. Extra modulus bits:
# log2(1 + 8 z / sqrt(n_min)) for distributed DP, log2(1 + 8 z) for local DP.
NOISE_TAIL = 8.0


def noise_bound(clip_norm: float, noise_std: float) -> float:
    """The clamp of a noised coordinate: C + NOISE_TAIL s."""
    return clip_norm + NOISE_TAIL * noise_std


def clamp_probability(coordinates: float) -> float:
    """An upper bound on the probability that the clamp binds on any of
    ``coordinates`` noised coordinates (union bound over P(|N(0, 1)| > 8))."""
    return min(1.0, coordinates * math.erfc(NOISE_TAIL / math.sqrt(2)))


class SecAggMean:
    """sum_k w_k u_k / W with w_k = 1 (uniform) or min(n_k / cap, 1) (capped) and W
    the survivors' total weight (public: each n_k travels in the clear). Under
    secure aggregation the server only ever calls :meth:`from_sum`."""

    name = "secagg_mean"
    needs_individual = False
    linear = True

    def __init__(self, weight_cap: int | None = None) -> None:
        self.weight_cap = weight_cap

    def weight(self, num_examples: float) -> float:
        return 1.0 if self.weight_cap is None else min(num_examples / self.weight_cap, 1.0)

    def from_sum(self, total: torch.Tensor, num_examples: Sequence[int]) -> torch.Tensor:
        """The aggregate from the unmasked sum of the weighted updates."""
        return total / sum(self.weight(n) for n in num_examples)

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w = torch.tensor([self.weight(float(n)) for n in weights], dtype=updates.dtype)
        return (w @ updates) / w.sum()

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        from fedforge.aggregation.mean import WeightedMean

        return WeightedMean().start(size, dtype)  # plain weights are never used here


# ------------------------------------------------------------------ messages
def _meta(phase: str, round_idx: int, client_id: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"phase": phase, "round_idx": round_idx}
    return meta if client_id is None else {**meta, "client_id": client_id}


def _ids(ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(ids), dtype=torch.int64)


def _rows(blobs: Sequence[bytes], width: int) -> torch.Tensor:
    if not blobs:
        return torch.zeros((0, width), dtype=torch.uint8)
    return torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8).reshape(-1, width)


def _read(data: bytes, phase: str, round_idx: int, client_id: int | None) -> wire.Message:
    msg = wire.decode(data)
    want = _meta(phase, round_idx, client_id)
    got = {k: msg.meta.get(k) for k in want}
    if got != want:
        raise UploadError(f"secure aggregation: message labelled {got!r:.200}; expected {want}")
    return msg


def _id_list(t: torch.Tensor, allowed: Sequence[int] | None = None) -> list[int]:
    ids = [int(v) for v in t.tolist()]
    if len(set(ids)) != len(ids) or (allowed is not None and not set(ids) <= set(allowed)):
        raise UploadError("secure aggregation: repeated or unknown client ids in a message")
    return ids


def advertise_message(round_idx: int, cohort: Sequence[int] | None = None) -> bytes:
    """SecAgg+: with the round's cohort, from which the client derives the graph."""
    tensors = {} if cohort is None else {"cohort": _ids(sorted(cohort))}
    return wire.encode(tensors, _meta("advertise", round_idx))


def share_keys_message(
    round_idx: int, keys: Mapping[int, tuple[bytes, bytes]], threshold: int
) -> bytes:
    """U1, each client's two public keys (channel, mask) and the threshold t."""
    ids = sorted(keys)
    tensors = {"ids": _ids(ids), "keys": _rows([keys[c][0] + keys[c][1] for c in ids], 64)}
    return wire.encode(tensors, {**_meta("share_keys", round_idx), "threshold": threshold})


def masked_input_message(round_idx: int, routed: Mapping[int, bytes], u2: Sequence[int]) -> bytes:
    """U2 and the ciphertexts the other clients of U2 sent this client."""
    senders = sorted(routed)
    tensors = {
        "u2": _ids(u2),
        "from": _ids(senders),
        "ct": _rows([routed[i] for i in senders], CIPHERTEXT_BYTES),
    }
    return wire.encode(tensors, _meta("masked_input", round_idx))


def unmask_message(round_idx: int, u3: Sequence[int]) -> bytes:
    return wire.encode({"u3": _ids(u3)}, _meta("unmask", round_idx))


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
    ids = _id_list(to, u1)
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
    ids = _id_list(got, u2)
    kind = expect_tensor(msg.tensors, "kind", (len(ids),), torch.uint8).tolist()
    if any(k > 1 for k in kind):
        raise UploadError("secure aggregation: a share's kind must be 0 (mask key) or 1 (b)")
    raw = expect_tensor(msg.tensors, "shares", (len(ids), SHARE_BYTES), torch.uint8).numpy()
    shares = [int.from_bytes(row.tobytes(), "big") for row in raw]
    if any(y >= shamir.PRIME for y in shares):
        raise UploadError("secure aggregation: a share is not below the field's prime 2^521 - 1")
    return {j: ("b" if k else "s", y) for j, k, y in zip(ids, kind, shares, strict=True)}


# --------------------------------------------------------------------- codec
class SecAggCodec:
    """The client's side of secure aggregation, and the masked update's codec."""

    name = "secagg"
    linear = True
    lossy = True  # fixed point: each coordinate rounds to 2^-(f+1)

    def __init__(
        self,
        bound: float,
        cohort_max: int,
        frac_bits: int,
        threshold: float,
        num_examples: Sequence[int],
        weight_cap: int | None = None,
        min_survivors: int = 1,
        neighbours: int | None = None,
        seed: int = 0,
    ) -> None:
        self.bound = bound  # every coordinate of w_k x_k lies in [-bound, bound]
        self.cohort_max = cohort_max
        self.threshold = threshold
        # distributed DP: its noise is calibrated to sums of at least this many inputs
        self.min_survivors = min_survivors
        self.neighbours = neighbours  # SecAgg+'s k; None: every pair (SecAgg)
        self.seed = seed  # the run seed: SecAgg+'s graph is public randomness
        self.num_examples = list(num_examples)  # a client knows its own n_k
        self.mean = SecAggMean(weight_cap)
        self.sessions: dict[int, SecAggClient] = {}  # client id -> this round's protocol
        # client id -> why it last aborted a round (its own note; the server sees a dropout)
        self.aborted: dict[int, str] = {}
        # what a pipeline around it must satisfy: the server sees only the sum
        self.constraints: tuple[Constraint, ...] = (ShowsOnlySum(),)
        try:
            self.fp = FixedPoint(frac_bits, modulus_bits(bound, cohort_max, frac_bits))
        except ConfigError as exc:  # the sum could wrap: refused when the pipeline is built
            self.constraints += (Unusable(str(exc)),)
            self.fp = FixedPoint(frac_bits, 64)

    def threshold_of(self, n: int) -> int:
        """t for ``n`` clients starting the protocol: ceil(threshold n), and at least
        ``min_survivors`` (distributed DP: a client refuses a lower t, and more than
        ``n`` means the round cannot run)."""
        return max(min_survivors(self.threshold, n), self.min_survivors)

    def graph(self, round_idx: int, cohort: Sequence[int]) -> MaskGraph:
        """The round's masking graph: complete with t = :meth:`threshold_of`, or
        SecAgg+'s random k-regular one with t of each closed neighbourhood."""
        if self.neighbours is None:
            return complete_graph(cohort, self.threshold_of(len(cohort)))
        return random_harary(cohort, self.neighbours, self.seed, round_idx, self.threshold)

    # ------------------------------------------------------ extra phases (client)
    def phase(self, name: str, client_id: int, data: bytes) -> bytes | None:
        """One client's answer to a phase message (None: nothing to send back,
        or the client aborted the round: see the module's note)."""
        if name == "masked_input":
            return self._answer(name, client_id, data)
        try:
            return self._answer(name, client_id, data)
        except (UploadError, ValueError, InvalidTag) as exc:
            self.sessions.pop(client_id, None)
            self.aborted[client_id] = f"{name}: {exc or type(exc).__name__}"
            return None

    def _answer(self, name: str, client_id: int, data: bytes) -> bytes | None:
        msg = wire.decode(data)
        r = msg.meta.get("round_idx")
        if msg.meta.get("phase") != name or not isinstance(r, int):
            raise UploadError(f"secure aggregation: not a '{name}' message")
        reply = _meta(name, r, client_id)
        if name == "advertise":
            cl = SecAggClient(client_id, r, 1, self.fp, self._neighbourhood(msg, client_id, r))
            self.sessions[client_id] = cl
            c_pk, s_pk = cl.advertise()
            raw_keys = torch.frombuffer(bytearray(c_pk + s_pk), dtype=torch.uint8)
            return wire.encode({"keys": raw_keys}, reply)
        cl = self._session(client_id, r)
        if name == "share_keys":
            ids = _id_list(msg.tensors["ids"])
            raw = msg.tensors["keys"].numpy()
            keys = {c: (raw[i, :32].tobytes(), raw[i, 32:].tobytes()) for i, c in enumerate(ids)}
            t = msg.meta.get("threshold")
            near = cl.neighbourhood
            least = (
                self.threshold_of(len(ids))
                if near is None
                else min_survivors(self.threshold, len(near))
            )
            if not isinstance(t, int) or t < least:
                raise UploadError(f"secure aggregation: threshold {t!r:.20} is below this run's")
            cl.t = t
            out = cl.share_keys(keys)
            to = sorted(out)
            return wire.encode(
                {"to": _ids(to), "ct": _rows([out[j] for j in to], CIPHERTEXT_BYTES)}, reply
            )
        if name == "masked_input":
            senders = _id_list(msg.tensors["from"])
            ct = msg.tensors["ct"].numpy()
            cl.receive(
                {j: ct[i].tobytes() for i, j in enumerate(senders)}, _id_list(msg.tensors["u2"])
            )
            return None  # the masked update follows with the training upload
        if name == "unmask":
            shares = cl.unmask(_id_list(msg.tensors["u3"]))
            del self.sessions[client_id]  # the round is over for this client
            ids = sorted(shares)
            tensors = {
                "ids": _ids(ids),
                "kind": torch.tensor([int(shares[j][0] == "b") for j in ids], dtype=torch.uint8),
                "shares": _rows(
                    [shares[j][1].to_bytes(SHARE_BYTES, "big") for j in ids], SHARE_BYTES
                ),
            }
            return wire.encode(tensors, reply)
        raise UploadError(f"secure aggregation: unknown phase {name!r:.40}")

    def _neighbourhood(
        self, msg: wire.Message, client_id: int, round_idx: int
    ) -> frozenset[int] | None:
        """SecAgg+: the client and its neighbours in the graph of the advertised
        cohort; None for the complete graph."""
        if self.neighbours is None:
            return None
        cohort = msg.tensors.get("cohort")
        if cohort is None or cohort.dtype != torch.int64 or cohort.ndim != 1:
            raise UploadError("secure aggregation: SecAgg+ needs the round's cohort")
        ids = _id_list(cohort)
        if client_id not in ids:
            raise UploadError(f"secure aggregation: client {client_id} is not in the cohort")
        return self.graph(round_idx, ids).closed(client_id)

    def _session(self, client_id: int, round_idx: int) -> SecAggClient:
        cl = self.sessions.get(client_id)
        if cl is None or cl.round != round_idx:
            raise UploadError(
                f"secure aggregation: client {client_id} has no keys for round {round_idx + 1}"
            )
        return cl

    # ---------------------------------------------------------------- the update
    def encode(
        self, delta: torch.Tensor, ctx: CodecContext | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """w_k x_k (clamped to the bound) in fixed point plus the round's masks."""
        if ctx is None or ctx.client_id is None:
            raise ValueError("secure aggregation encodes a client's update and needs its context")
        cl = self._session(ctx.client_id, ctx.round_idx)
        if not all_finite(delta):  # diverged: drop out, send no input
            return {}, {"codec": self.name, "withheld": "the update is not finite"}
        w = self.mean.weight(self.num_examples[ctx.client_id])
        x = (delta.to(torch.float64) * w).clamp(-self.bound, self.bound).numpy()
        y = cl.masked_input(x)
        meta = {"codec": self.name, "frac_bits": self.fp.frac_bits, "bits": self.fp.bits}
        return {"masked": torch.from_numpy(pack_words(y, self.fp.bits))}, meta

    def decode(
        self,
        tensors: Mapping[str, torch.Tensor],
        meta: Mapping[str, Any],
        size: int,
        dtype: torch.dtype,
        ctx: CodecContext | None = None,
    ) -> torch.Tensor:
        raise UploadError("a masked update alone cannot be decoded: only the cohort's sum can")

    def decode_masked(
        self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], size: int
    ) -> np.ndarray:
        """The masked vector of an update as uint64 words below 2^k (sent packed,
        k bits a word)."""
        if "withheld" in meta:  # the client dropped out instead (e.g. a diverged run)
            raise UploadError(f"secure aggregation: no masked input: {meta['withheld']!s:.100}")
        expect_codec(meta, self.name, tensors, {"masked"})
        got = (meta.get("bits"), meta.get("frac_bits"))
        if got != (self.fp.bits, self.fp.frac_bits):
            raise UploadError(
                f"masked update in fixed point (bits, frac_bits) = {got!r:.60}; this round's "
                f"is ({self.fp.bits}, {self.fp.frac_bits})"
            )
        nbytes = (size * self.fp.bits + 7) // 8
        packed = expect_tensor(tensors, "masked", (nbytes,), torch.uint8).numpy()
        return unpack_words(packed, self.fp.bits, size)

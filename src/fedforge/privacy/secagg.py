"""Secure aggregation (Bonawitz et al. 2017, "Practical secure aggregation for
privacy-preserving machine learning"): the server learns the sum of the
cohort's updates and nothing else, even when clients drop out at any phase.

Each client encodes its clipped delta in fixed point, x -> round(x 2^f) mod 2^k
(k sized from the clip bound and the cohort so that the sum cannot wrap), and
adds a self mask PRG(b_i) and pairwise masks +-PRG(s_ij) that cancel in the sum.
Real cryptography (``cryptography``): X25519 key agreement, HKDF to derive the
pairwise seeds and channel keys, AES-GCM for the secret shares the server
routes, AES-CTR as the PRG. Shamir shares (``shamir.py``, threshold t) of b_i
and of the mask key let the survivors unmask: the server rebuilds b_i of every
client whose masked input arrived and the mask key of every client that
dropped after sharing keys. Fewer than t survivors at any phase end the round.
With SecAgg+ (Bell et al. 2020, ``secagg_graph.py``) the pairs and the share
holders are the edges of a random k-regular graph instead of every pair; the
same code runs both, a :class:`~fedforge.privacy.secagg_graph.MaskGraph` saying
who is whose neighbour (the complete graph: SecAgg).

Phases: advertise keys, share keys, masked input, unmasking. Client code is
:class:`SecAggClient` (runs on the client; trusts only its own keys and the
authenticated ciphertexts); :func:`secure_sum` is the server (trusts nothing:
it only ever sees masked vectors and shares); it reaches the clients through a
``call(phase, client_id, message)`` function: calls in simulation, messages in
deployment.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedforge.core.errors import ConfigError
from fedforge.privacy import shamir
from fedforge.privacy.secagg_graph import MaskGraph, complete_graph

PHASES = ("advertise", "share_keys", "masked_input", "unmask")
RAW = serialization.Encoding.Raw
SHARE_BYTES = (shamir.PRIME.bit_length() + 7) // 8  # 66: a share in GF(2^521 - 1)
KEY_BYTES = 32  # X25519 public keys, seeds
# One encrypted share pair: sender, receiver, b share, mask-key share (fixed width,
# so every ciphertext has the same size: 12-byte nonce + plaintext + 16-byte tag).
_SHARE = struct.Struct(f">II{SHARE_BYTES}s{SHARE_BYTES}s")
CIPHERTEXT_BYTES = 12 + _SHARE.size + 16


# --------------------------------------------------------------- fixed point
def modulus_bits(clip_norm: float, cohort: int, frac_bits: int) -> int:
    """k such that the sum of ``cohort`` vectors of coordinates in [-C, C], each
    rounded to 2^-f, lies in (-2^(k-1), 2^(k-1)): no wrap-around."""
    bound = cohort * (clip_norm * 2**frac_bits + 0.5)
    k = math.floor(math.log2(bound)) + 2
    if k > 64:
        raise ConfigError(
            f"secure aggregation of {cohort} updates of norm <= {clip_norm} at "
            f"{frac_bits} fraction bits needs a {k}-bit modulus (> 64): lower "
            "privacy.secagg_frac_bits or the clip norm"
        )
    return k


@dataclass(frozen=True)
class FixedPoint:
    """x -> round(x 2^f) mod 2^k as uint64, and sums back to floats."""

    frac_bits: int
    bits: int

    @property
    def mask(self) -> np.uint64:
        return np.uint64((1 << self.bits) - 1) if self.bits < 64 else np.uint64(2**64 - 1)

    def encode(self, x: np.ndarray) -> np.ndarray:
        q = np.rint(np.asarray(x, dtype=np.float64) * 2.0**self.frac_bits).astype(np.int64)
        return q.astype(np.uint64) & self.mask

    def decode(self, total: np.ndarray) -> np.ndarray:
        v = (total & self.mask).astype(np.uint64)
        shift = np.uint64(64 - self.bits)  # sign-extend bit k - 1 (any k up to 64)
        signed = (v << shift).view(np.int64) >> shift.astype(np.int64)
        return signed.astype(np.float64) / 2.0**self.frac_bits


def keystream(seed: bytes, size: int, bits: int) -> np.ndarray:
    """``size`` words of AES-256-CTR keystream under ``seed``: 4-byte words when
    k = ``bits`` <= 32 (uniform mod 2^k all the same, and half the AES work),
    else 8-byte words. Masks are added and subtracted mod 2^64 and reduced to k
    bits once at the end (2^k divides 2^64), so no word is reduced here. Written
    straight into the result from a shared zero buffer (measured: 3-4x faster
    than encrypting a fresh zero string, masking and adding copies)."""
    dtype = np.uint32 if bits <= 32 else np.uint64
    width = np.dtype(dtype).itemsize
    out = np.empty(size + 16 // width, dtype=dtype)  # CTR writes up to a block - 1 past
    enc = Cipher(algorithms.AES(seed), modes.CTR(b"\0" * 16)).encryptor()
    enc.update_into(_zeros(width * size), out.view(np.uint8).data)
    return out[:size]


_ZEROS = [memoryview(b"")]


def _zeros(nbytes: int) -> memoryview:
    """``nbytes`` zero bytes, from one buffer grown as needed (never written)."""
    if len(_ZEROS[0]) < nbytes:
        _ZEROS[0] = memoryview(bytes(nbytes))
    return _ZEROS[0][:nbytes]


def add_mask(total: np.ndarray, mask_words: np.ndarray, sign: int) -> None:
    """total += sign * mask_words mod 2^64, in place (``total`` uint64; 4-byte
    words widen on the fly)."""
    (np.add if sign > 0 else np.subtract)(total, mask_words, out=total)


def _hkdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, None, info).derive(secret)


def _pk(raw: bytes) -> X25519PublicKey:
    return X25519PublicKey.from_public_bytes(raw)


def agreeable(raw: bytes) -> bool:
    """Whether an advertised public key gives a shared secret. A low-order point
    (e.g. all zeros) gives the all-zero secret, which X25519 refuses for every
    private key (clamping makes it a multiple of the cofactor): a client that
    advertised one would make its honest neighbours fail when they encrypt their
    shares to it, and the server when it rebuilds a dropped client's masks."""
    try:
        X25519PrivateKey.generate().exchange(_pk(raw))
    except ValueError:
        return False
    return True


# -------------------------------------------------------------------- client
class SecAggClient:
    """One client's side of one round; its secrets never leave it unshared."""

    def __init__(
        self,
        client_id: int,
        round_idx: int,
        threshold: int,
        fp: FixedPoint,
        neighbourhood: frozenset[int] | None = None,
    ) -> None:
        self.id, self.round, self.t, self.fp = client_id, round_idx, threshold, fp
        self.neighbourhood = neighbourhood  # SecAgg+: itself and its neighbours; None: anyone
        self.c_sk = X25519PrivateKey.generate()  # channel key (encrypts shares)
        self.s_sk = X25519PrivateKey.generate()  # mask key (pairwise seeds)
        self.b = os.urandom(32)  # self-mask seed
        self.keys: dict[int, tuple[bytes, bytes]] = {}
        self.inbox: dict[int, bytes] = {}
        self.u2: list[int] = []
        self.answered = False  # the unmask request is answered once

    def advertise(self) -> tuple[bytes, bytes]:
        return self.c_sk.public_key().public_bytes_raw(), self.s_sk.public_key().public_bytes_raw()

    def _channel(self, other: int) -> AESGCM:
        shared = self.c_sk.exchange(_pk(self.keys[other][0]))
        return AESGCM(_hkdf(shared, b"fedforge secagg channel %d" % self.round))

    def _aad(self, sender: int, receiver: int) -> bytes:
        return b"%d/%d/%d" % (self.round, sender, receiver)

    def share_keys(self, keys: Mapping[int, tuple[bytes, bytes]]) -> dict[int, bytes]:
        """Shamir-share b and the mask key among the advertised clients; one AES-GCM
        ciphertext per other client, routed by the server."""
        if len(keys) < self.t:
            raise ValueError(f"only {len(keys)} clients advertised keys; threshold is {self.t}")
        if self.neighbourhood is not None and not set(keys) <= self.neighbourhood:
            outside = sorted(set(keys) - self.neighbourhood)[:5]
            raise ValueError(f"keys of clients {outside} outside client {self.id}'s neighbourhood")
        self.keys = dict(keys)
        ids = sorted(keys)
        raw_s = self.s_sk.private_bytes_raw()
        b_shares = dict(shamir.split(int.from_bytes(self.b, "big"), [j + 1 for j in ids], self.t))
        s_shares = dict(shamir.split(int.from_bytes(raw_s, "big"), [j + 1 for j in ids], self.t))
        out = {}
        for j in ids:
            if j == self.id:
                self.own = (b_shares[j + 1], s_shares[j + 1])
                continue
            plain = _SHARE.pack(
                self.id,
                j,
                *(v.to_bytes(SHARE_BYTES, "big") for v in (b_shares[j + 1], s_shares[j + 1])),
            )
            nonce = os.urandom(12)
            out[j] = nonce + self._channel(j).encrypt(nonce, plain, self._aad(self.id, j))
        return out

    def receive(self, ciphertexts: Mapping[int, bytes], u2: Sequence[int]) -> None:
        """The shares others sent this client, and who shared (U2)."""
        self.inbox = dict(ciphertexts)
        self.u2 = sorted(u2)

    def masked_input(self, x: np.ndarray) -> np.ndarray:
        """y = encode(x) + PRG(b) + sum_{j>i} PRG(s_ij) - sum_{j<i} PRG(s_ij) mod 2^k."""
        if len(self.u2) < self.t:
            raise ValueError(f"only {len(self.u2)} clients shared keys; threshold is {self.t}")
        y = self.fp.encode(x)
        add_mask(y, keystream(self.b, x.size, self.fp.bits), +1)
        for j in self.u2:
            if j == self.id:
                continue
            p = pairwise(self.s_sk, self.keys[j][1], self.round, x.size, self.fp.bits)
            add_mask(y, p, +1 if j > self.id else -1)
        return y & self.fp.mask

    def unmask(self, u3: Sequence[int]) -> dict[int, tuple[str, int]]:
        """For each other client of U2: its b share if it sent a masked input
        (in U3), else its mask-key share, never both: answered once a round, and
        only for a U3 of at least t clients that shared keys with this one
        (Bonawitz et al., round 4), itself among them. A server that listed
        made-up ids, or asked twice with two lists, would otherwise get both
        secrets of a client and its update in the clear."""
        if self.answered:
            raise ValueError(f"client {self.id} already answered this round's unmask request")
        alive = set(u3)
        if not alive <= set(self.u2) or self.id not in alive:
            raise ValueError(
                f"U3 is not a set of clients that shared keys with client {self.id}, "
                "itself included"
            )
        if len(alive) < self.t:
            raise ValueError(f"only {len(alive)} masked inputs; threshold is {self.t}")
        self.answered = True
        out: dict[int, tuple[str, int]] = {self.id: ("b", self.own[0])}
        for j in self.u2:
            if j == self.id:
                continue
            ct = self.inbox[j]
            plain = self._channel(j).decrypt(ct[:12], ct[12:], self._aad(j, self.id))
            sender, receiver, b_raw, s_raw = _SHARE.unpack(plain)
            b_share, s_share = int.from_bytes(b_raw, "big"), int.from_bytes(s_raw, "big")
            if (sender, receiver) != (j, self.id):
                raise ValueError(f"share from client {j} is labelled {sender} -> {receiver}")
            out[j] = ("b", b_share) if j in alive else ("s", s_share)
        return out


def pairwise(
    sk: X25519PrivateKey, other_pk: bytes, round_idx: int, size: int, bits: int
) -> np.ndarray:
    """PRG(s_ij) (unreduced words), s_ij = HKDF(X25519(sk_i, pk_j)): the same for i and j."""
    seed = _hkdf(sk.exchange(_pk(other_pk)), b"fedforge secagg mask %d" % round_idx)
    return keystream(seed, size, bits)


# -------------------------------------------------------------------- server
Call = Callable[[str, int, Any], Any]  # (phase, client id, message) -> reply


@dataclass
class SecAggResult:
    """The unmasked sum (None when the round ended) and what happened."""

    total: np.ndarray | None
    reason: str | None
    survivors: list[int]  # clients whose inputs are in the sum
    bytes_up: int = 0


def secure_sum(
    clients: Sequence[int],
    size: int,
    threshold: int,
    fp: FixedPoint,
    call: Call,
    drops: Mapping[str, set[int]] | None = None,
    graph: MaskGraph | None = None,
    round_idx: int | None = None,
) -> SecAggResult:
    """The server's four phases. ``call`` reaches a client (None: it dropped);
    ``drops`` simulates clients that stop answering before a phase; ``graph`` is
    SecAgg+'s (None: the complete graph with t = ``threshold``); ``round_idx``:
    the round (default: the call's, as :class:`Simulated` carries it)."""
    drops = drops or {}
    graph = graph or complete_graph(clients, threshold)

    def ask(phase: str, ids: Sequence[int], msg: Callable[[int], Any]) -> dict[int, Any]:
        replies = {}
        for c in ids:
            if c in drops.get(phase, set()):
                continue
            reply = call(phase, c, msg(c))
            if reply is not None:
                replies[c] = reply
        return replies

    def short(phase: str, alive: Collection[int], whose: Collection[int]) -> SecAggResult | None:
        why = graph.shortfall(alive, whose, phase, threshold)
        return None if why is None else SecAggResult(None, why, [])

    keys = ask("advertise", clients, lambda c: None)
    if end := short("advertise", keys, keys):
        return end
    u1 = sorted(keys)
    shares = ask("share_keys", u1, lambda c: {i: keys[i] for i in graph.within(c, u1)})
    if end := short("share_keys", shares, shares):
        return end
    u2 = sorted(shares)
    routed = route(shares)
    masked = ask("masked_input", u2, lambda c: (routed[c], graph.within(c, u2)))
    if end := short("masked_input", masked, u2):
        return end
    u3 = sorted(masked)
    if why := graph.split(u3):
        return SecAggResult(None, why, [])
    replies = ask("unmask", u3, lambda c: graph.within(c, u3))
    if end := short("unmask", replies, u2):
        return end
    r = fp_round(call) if round_idx is None else round_idx
    total, why = unmask_sum(masked, replies, keys, u2, graph, fp, r, size)
    return SecAggResult(total, why, u3 if total is not None else [])


def route(shares: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
    """The ciphertexts each client of U2 (the clients that shared) receives: one
    from every other client of U2 that shared with it (its neighbours)."""
    u2 = sorted(shares)
    return {j: {i: shares[i][j] for i in u2 if j in shares[i]} for j in u2}


def unmask_sum(
    masked: Mapping[int, np.ndarray],
    replies: Mapping[int, Mapping[int, tuple[str, int]]],
    keys: Mapping[int, tuple[bytes, bytes]],
    u2: Sequence[int],
    graph: MaskGraph,
    fp: FixedPoint,
    round_idx: int,
    size: int,
) -> tuple[np.ndarray | None, str | None]:
    """The server's last step: the sum of the masked inputs (clients U3) minus
    every self mask PRG(b_i) of U3, and with the pairwise masks between the
    clients of U2 that dropped before sending their input and their neighbours
    of U3 rebuilt from their mask keys (t = ``graph.t`` shares each).
    Returns (sum mod 2^k, None) or (None, why) when shares are missing."""
    threshold = graph.t
    mask = fp.mask
    u3 = sorted(masked)
    total = np.zeros(size, dtype=np.uint64)
    for c in u3:
        add_mask(total, masked[c], +1)
    for j in u2:  # each client's b (in U3) or mask key (dropped after sharing)
        kind = "b" if j in masked else "s"
        pts = [(i + 1, r[j][1]) for i, r in replies.items() if j in r and r[j][0] == kind]
        if len(pts) < threshold:
            return None, f"secure aggregation: only {len(pts)} shares of client {j}'s {kind}"
        value = shamir.reconstruct(pts[:threshold])
        if value >= 1 << (8 * KEY_BYTES):  # honest shares rebuild a 32-byte secret
            return None, (
                f"secure aggregation: the shares of client {j}'s {kind} rebuild no "
                f"{KEY_BYTES}-byte secret (a survivor sent a corrupt share)"
            )
        secret = value.to_bytes(KEY_BYTES, "big")
        if kind == "b":
            add_mask(total, keystream(secret, size, fp.bits), -1)
            continue
        sk = X25519PrivateKey.from_private_bytes(secret)
        for i in graph.within(j, u3):  # survivor i added +PRG(s_ij) if j > i, else -PRG(s_ij)
            p = pairwise(sk, keys[i][1], round_idx, size, fp.bits)
            add_mask(total, p, -1 if j > i else +1)
    return total & mask, None


def fp_round(call: Call) -> int:
    """The round a ``call`` belongs to (its ``round_idx``): the pairwise masks are
    derived from it, so a wrong round would unmask garbage."""
    round_idx = getattr(call, "round_idx", None)
    if not isinstance(round_idx, int):
        raise ValueError("secure_sum needs the round: pass round_idx, or a call that has one")
    return round_idx


class Simulated:
    """The simulation's ``call``: one :class:`SecAggClient` per client in this
    process, each fed its own input at the masked-input phase."""

    def __init__(
        self,
        inputs: Mapping[int, np.ndarray],
        round_idx: int,
        threshold: int,
        fp: FixedPoint,
        graph: MaskGraph | None = None,
    ) -> None:
        """``graph``: SecAgg+'s (each client's neighbourhood and t); None: SecAgg."""
        self.inputs = inputs
        self.round_idx = round_idx
        self.clients = {
            c: SecAggClient(c, round_idx, threshold, fp)
            if graph is None
            else SecAggClient(c, round_idx, graph.t, fp, graph.closed(c))
            for c in inputs
        }
        self.bits = fp.bits
        self.bytes_up = 0
        self.client_seconds = 0.0  # time spent inside the clients' code, all phases

    def __call__(self, phase: str, client_id: int, message: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._answer(phase, self.clients[client_id], message)
        finally:
            self.client_seconds += time.perf_counter() - start

    def _answer(self, phase: str, cl: SecAggClient, message: Any) -> Any:
        if phase == "advertise":
            return cl.advertise()
        if phase == "share_keys":
            out = cl.share_keys(message)
            self.bytes_up += sum(len(v) for v in out.values())
            return out
        if phase == "masked_input":
            cl.receive(*message)
            y = cl.masked_input(self.inputs[cl.id])
            self.bytes_up += (y.size * self.bits + 7) // 8  # sent packed at k bits a word
            return y
        return cl.unmask(message)

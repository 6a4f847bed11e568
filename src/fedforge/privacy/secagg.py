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

Phases: advertise keys, share keys, masked input, unmasking. This module is the
client, :class:`SecAggClient` (runs on the client; trusts only its own keys and
the authenticated ciphertexts); the fixed point, masks and key derivation are in
``secagg_masks.py``; the server's routing and unmasking, and the reference
:func:`~fedforge.privacy.secagg_server.secure_sum` over simulated clients, in
``secagg_server.py`` (trusts nothing: it only ever sees masked vectors and
shares).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fedforge.privacy import shamir
from fedforge.privacy.secagg_masks import (
    SHARE_BYTES,
    SHARE_PAIR,
    FixedPoint,
    add_mask,
    hkdf,
    keystream,
    pairwise,
    public_key,
)

PHASES = ("advertise", "share_keys", "masked_input", "unmask")


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
        shared = self.c_sk.exchange(public_key(self.keys[other][0]))
        return AESGCM(hkdf(shared, b"fedforge secagg channel %d" % self.round))

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
            plain = SHARE_PAIR.pack(
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
            sender, receiver, b_raw, s_raw = SHARE_PAIR.unpack(plain)
            b_share, s_share = int.from_bytes(b_raw, "big"), int.from_bytes(s_raw, "big")
            if (sender, receiver) != (j, self.id):
                raise ValueError(f"share from client {j} is labelled {sender} -> {receiver}")
            out[j] = ("b", b_share) if j in alive else ("s", s_share)
        return out

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
import struct
from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fedforge.core.errors import ProtocolError
from fedforge.privacy import shamir
from fedforge.privacy.secagg_masks import (
    SHARE_BYTES,
    SHARE_PAIR,
    FixedPoint,
    add_mask,
    channel_key,
    keystream,
    mask_seed,
)

PHASES = ("advertise", "share_keys", "masked_input", "unmask")


# -------------------------------------------------------------------- client
class SecAggClient:
    """One client's side of one round; its secrets never leave it unshared.

    It checks every server message as Bonawitz et al.'s honest client does and
    raises :class:`~fedforge.core.errors.ProtocolError` where it must stop: too
    few clients listed (keys, U2 or U3 below t), a U2 or U3 that is not a subset
    of the clients it shared with, the server's copy of its own keys altered, two
    clients with the same keys, a phase asked twice, a share that does not
    decrypt or is mislabelled. Once aborted it answers nothing more this round;
    its driver counts it as a dropout. Keys from outside its SecAgg+
    neighbourhood (Bell et al. 2020), and keys that give no shared secret, are a
    faulty peer's: it leaves those peers out and aborts only when fewer than t
    clients are left."""

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
        # peer -> (channel key, pairwise mask seed s_ij), derived when keys are shared
        self.secrets: dict[int, tuple[bytes, bytes]] = {}
        self.ignored: list[int] = []  # peers whose keys it left out (faulty peers)
        self.own: tuple[int, int] = (0, 0)  # its own shares of b and the mask key
        self.inbox: dict[int, bytes] = {}
        self.u2: list[int] = []
        self.done: set[str] = set()  # share_keys and unmask are answered once
        self.aborted: str | None = None  # why it stopped this round

    def _abort(self, why: str) -> ProtocolError:
        """Stop this round (every later request is refused too): the error to raise."""
        self.aborted = self.aborted or f"client {self.id} aborted the round: {why}"
        return ProtocolError(self.aborted)

    def _step(self, phase: str, once: bool = False) -> None:
        """Refuse ``phase`` after an abort, or a second time when ``once``."""
        if self.aborted is not None:
            raise ProtocolError(self.aborted)
        if once and phase in self.done:
            raise self._abort(f"it already answered this round's {phase} request")
        self.done.add(phase)

    def advertise(self) -> tuple[bytes, bytes]:
        return self.c_sk.public_key().public_bytes_raw(), self.s_sk.public_key().public_bytes_raw()

    def _channel(self, other: int) -> AESGCM:
        return AESGCM(self.secrets[other][0])

    def _aad(self, sender: int, receiver: int) -> bytes:
        return b"%d/%d/%d" % (self.round, sender, receiver)

    def _valid_keys(
        self, keys: Mapping[int, tuple[bytes, bytes]]
    ) -> dict[int, tuple[bytes, bytes]]:
        """The keys it shares with: its own as it advertised them and every other
        client's, all pairs distinct, but for faulty peers', left out (SecAgg+:
        outside its neighbourhood; a key with no shared secret)."""
        if keys.get(self.id) != self.advertise():
            raise self._abort("the server did not list its own keys as it advertised them")
        if len(set(keys.values())) != len(keys):
            raise self._abort("two clients were listed with the same keys")
        near = self.neighbourhood
        valid = {self.id: keys[self.id]}
        for j, (c_pk, s_pk) in keys.items():
            if j == self.id or (near is not None and j not in near):
                continue
            try:
                self.secrets[j] = (
                    channel_key(self.c_sk, c_pk, self.round),
                    mask_seed(self.s_sk, s_pk, self.round),
                )
            except ValueError:  # a low-order point or no key at all: no shared secret
                continue
            valid[j] = (c_pk, s_pk)
        self.ignored = sorted(set(keys) - set(valid))
        if len(valid) < self.t:
            left = f" ({len(self.ignored)} faulty peer(s) left out)" if self.ignored else ""
            raise self._abort(f"only {len(valid)} clients' keys{left}; threshold is {self.t}")
        return valid

    def share_keys(self, keys: Mapping[int, tuple[bytes, bytes]]) -> dict[int, bytes]:
        """Shamir-share b and the mask key among the advertised clients; one AES-GCM
        ciphertext per other client, routed by the server."""
        self._step("share_keys", once=True)
        self.keys = self._valid_keys(keys)
        ids = sorted(self.keys)
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
        """The shares others sent this client, and who shared (U2): at least t
        clients it shared with, itself among them, a share from each other one."""
        self._step("receive")
        alive = set(u2)
        if "share_keys" not in self.done or not alive <= set(self.keys) or self.id not in alive:
            raise self._abort(f"U2 is not a set of clients client {self.id} shared with")
        if len(alive) < self.t:
            raise self._abort(f"only {len(alive)} clients shared keys; threshold is {self.t}")
        if set(ciphertexts) != alive - {self.id}:
            raise self._abort("the routed shares are not one from each other client of U2")
        self.inbox = dict(ciphertexts)
        self.u2 = sorted(alive)

    def masked_input(self, x: np.ndarray) -> np.ndarray:
        """y = encode(x) + PRG(b) + sum_{j>i} PRG(s_ij) - sum_{j<i} PRG(s_ij) mod 2^k."""
        self._step("masked_input", once=True)
        if len(self.u2) < self.t:
            raise self._abort(f"only {len(self.u2)} clients shared keys; threshold is {self.t}")
        y = self.fp.encode(x)
        add_mask(y, keystream(self.b, x.size, self.fp.bits), +1)
        for j in self.u2:
            if j == self.id:
                continue
            p = keystream(self.secrets[j][1], x.size, self.fp.bits)  # PRG(s_ij)
            add_mask(y, p, +1 if j > self.id else -1)
        return y & self.fp.mask

    def unmask(self, u3: Sequence[int]) -> dict[int, tuple[str, int]]:
        """For each other client of U2: its b share if it sent a masked input
        (in U3), else its mask-key share, never both: answered once a round, and
        only for a U3 of at least t clients that shared keys with this one
        (Bonawitz et al., round 4), itself among them. A server that listed
        made-up ids, or asked twice with two lists, would otherwise get both
        secrets of a client and its update in the clear."""
        self._step("unmask", once=True)
        alive = set(u3)
        if not alive <= set(self.u2) or self.id not in alive:
            raise self._abort(
                f"U3 is not a set of clients that shared keys with client {self.id}, "
                "itself included"
            )
        if len(alive) < self.t:
            raise self._abort(f"only {len(alive)} masked inputs; threshold is {self.t}")
        out: dict[int, tuple[str, int]] = {self.id: ("b", self.own[0])}
        for j in self.u2:
            if j == self.id:
                continue
            ct = self.inbox[j]
            try:
                plain = self._channel(j).decrypt(ct[:12], ct[12:], self._aad(j, self.id))
                sender, receiver, b_raw, s_raw = SHARE_PAIR.unpack(plain)
            except (InvalidTag, struct.error):
                raise self._abort(f"the share from client {j} does not decrypt") from None
            if (sender, receiver) != (j, self.id):
                raise self._abort(f"the share from client {j} is labelled {sender} -> {receiver}")
            b_share, s_share = int.from_bytes(b_raw, "big"), int.from_bytes(s_raw, "big")
            out[j] = ("b", b_share) if j in alive else ("s", s_share)
        return out

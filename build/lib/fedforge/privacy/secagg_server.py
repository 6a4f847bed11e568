"""Secure aggregation's server side (Bonawitz et al. 2017; SecAgg+, Bell et al.
2020, through a :class:`~fedforge.privacy.secagg_graph.MaskGraph`): routing the
encrypted shares and unmasking the sum, which the round's collector
(``server/collectors/secure.py``) runs, and :func:`secure_sum`, the four phases
as one function over a ``call(phase, client_id, message)`` that reaches the
clients (:class:`Simulated`: one :class:`~fedforge.privacy.secagg.SecAggClient`
per client in this process), the reference the tests and benchmarks measure.
Trusts nothing: it sees public keys, ciphertexts, masked vectors and shares.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedforge.core.errors import ProtocolError
from fedforge.privacy import shamir
from fedforge.privacy.secagg import SecAggClient
from fedforge.privacy.secagg_graph import MaskGraph, complete_graph
from fedforge.privacy.secagg_masks import KEY_BYTES, FixedPoint, add_mask, keystream, pairwise

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
    process, each fed its own input at the masked-input phase. A client that
    aborts the round (:class:`~fedforge.core.errors.ProtocolError`) answers None,
    a dropout to :func:`secure_sum`; ``aborted`` keeps why."""

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
        self.aborted: dict[int, str] = {}  # client id -> why it aborted the round

    def __call__(self, phase: str, client_id: int, message: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._answer(phase, self.clients[client_id], message)
        except ProtocolError as exc:
            self.aborted[client_id] = str(exc)
            return None
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

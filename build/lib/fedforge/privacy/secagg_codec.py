"""Secure aggregation in the round (Bonawitz et al. 2017): the client's last stage
and its answers to the phase messages (``secagg_wire.py``).

:class:`SecAggCodec` is the codec of a run with ``privacy.secagg``: it keeps each
client's :class:`~fedforge.privacy.secagg.SecAggClient` of the round, answers the
extra phases (advertise keys, share keys, receive the routed shares, unmask) and
encodes the clipped (and noised) delta as ``w_k x_k`` in fixed point plus masks,
k bits a word on the wire
(``w_k`` uniform 1 or ``min(n_k / cap, 1)``: the DP mean's weights; the server
divides the unmasked sum by a public total weight, :class:`SecAggMean`). Runs
on the client (``phase``, ``encode``; the server decodes a masked update with
``decode_masked``). With ``neighbours`` = k it runs
SecAgg+ (Bell et al. 2020, ``secagg_graph.py``): the advertise message carries
the cohort, from which each client derives the round's graph (run seed, round)
and its neighbourhood; every later message holds only that neighbourhood.

A client that cannot take a phase message (a malformed message, a threshold
below the run's, or what :class:`~fedforge.privacy.secagg.SecAggClient` refuses
with a ``ProtocolError``: too few clients listed, a phase asked twice, a share
that does not decrypt) aborts the round, as the paper's honest client does: it
forgets its keys and answers with an abort note instead (at the masked-input
phase, its upload is the note), which the server logs as a refused client, a
dropout, with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedforge.aggregation.mean import Accumulator
from fedforge.core import wire
from fedforge.core.errors import ConfigError, ProtocolError, UploadError
from fedforge.core.params import all_finite
from fedforge.pipeline.codec import (
    CodecContext,
    Encoded,
    Received,
    WireCodec,
    expect_codec,
    expect_tensor,
)
from fedforge.pipeline.constraints import ShowsOnlySum, Unusable
from fedforge.pipeline.pipeline import Constraint
from fedforge.privacy.secagg import SecAggClient
from fedforge.privacy.secagg_graph import MaskGraph, complete_graph, min_survivors, random_harary
from fedforge.privacy.secagg_masks import (
    CIPHERTEXT_BYTES,
    SHARE_BYTES,
    FixedPoint,
    modulus_bits,
)
from fedforge.privacy.secagg_wire import (
    ABORT,
    abort_message,
    id_tensor,
    ids_of,
    meta_of,
    rows,
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

    def from_sum(self, total: torch.Tensor, num_examples: Sequence[float]) -> torch.Tensor:
        """The aggregate from the unmasked sum of the weighted updates."""
        return total / sum(self.weight(n) for n in num_examples)

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w = torch.tensor([self.weight(float(n)) for n in weights], dtype=updates.dtype)
        return (w @ updates) / w.sum()

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        from fedforge.aggregation.mean import WeightedMean

        return WeightedMean().start(size, dtype)  # plain weights are never used here


# --------------------------------------------------------------------- codec
class SecAggCodec(WireCodec):
    """The client's side of secure aggregation, and the masked update's codec."""

    name = "secagg"
    sends = frozenset({"masked"})
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
        """One client's answer to a phase message (None: nothing to send back), or
        its abort note (see the module's note)."""
        try:
            return self._answer(name, client_id, data)
        except (UploadError, ProtocolError) as exc:
            self.sessions.pop(client_id, None)
            why = str(exc).removeprefix("secure aggregation: ")
            if not why.startswith(f"client {client_id} aborted"):
                why = f"client {client_id} aborted the round: {why}"
            self.aborted[client_id] = why
            r = _round_of(data)
            return None if r is None else abort_message(name, r, client_id, why)

    def _answer(self, name: str, client_id: int, data: bytes) -> bytes | None:
        msg = wire.decode(data)
        r = msg.meta.get("round_idx")
        if msg.meta.get("phase") != name or not isinstance(r, int):
            raise UploadError(f"secure aggregation: not a '{name}' message")
        reply = meta_of(name, r, client_id)
        if name == "advertise":
            cl = SecAggClient(client_id, r, 1, self.fp, self._neighbourhood(msg, client_id, r))
            self.sessions[client_id] = cl
            c_pk, s_pk = cl.advertise()
            raw_keys = torch.frombuffer(bytearray(c_pk + s_pk), dtype=torch.uint8)
            return wire.encode({"keys": raw_keys}, reply)
        cl = self._session(client_id, r)
        if name == "share_keys":
            ids = ids_of(msg, "ids")
            raw = expect_tensor(msg.tensors, "keys", (len(ids), 64), torch.uint8).numpy()
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
                {"to": id_tensor(to), "ct": rows([out[j] for j in to], CIPHERTEXT_BYTES)}, reply
            )
        if name == "masked_input":
            senders = ids_of(msg, "from")
            shape = (len(senders), CIPHERTEXT_BYTES)
            ct = expect_tensor(msg.tensors, "ct", shape, torch.uint8).numpy()
            cl.receive({j: ct[i].tobytes() for i, j in enumerate(senders)}, ids_of(msg, "u2"))
            return None  # the masked update follows with the training upload
        if name == "unmask":
            shares = cl.unmask(ids_of(msg, "u3"))
            del self.sessions[client_id]  # the round is over for this client
            ids = sorted(shares)
            tensors = {
                "ids": id_tensor(ids),
                "kind": torch.tensor([int(shares[j][0] == "b") for j in ids], dtype=torch.uint8),
                "shares": rows(
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
        if "cohort" not in msg.tensors:
            raise UploadError("secure aggregation: SecAgg+ needs the round's cohort")
        ids = ids_of(msg, "cohort")
        if client_id not in ids:
            raise UploadError(f"secure aggregation: client {client_id} is not in the cohort")
        return self.graph(round_idx, ids).closed(client_id)

    def _session(self, client_id: int, round_idx: int) -> SecAggClient:
        """The client's protocol object of the round (none after it aborted)."""
        cl = self.sessions.get(client_id)
        if cl is None or cl.round != round_idx:
            raise UploadError(
                f"secure aggregation: client {client_id} has no keys for round {round_idx + 1}"
            )
        return cl

    # ---------------------------------------------------------------- the update
    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded:
        """w_k x_k (clamped to the bound) in fixed point plus the round's masks."""
        if ctx is None or ctx.client_id is None:
            raise ValueError("secure aggregation encodes a client's update and needs its context")
        why = self.aborted.get(ctx.client_id)
        cl = self.sessions.get(ctx.client_id)
        if why is not None and (cl is None or cl.round != ctx.round_idx):
            return {}, {"codec": self.name, ABORT: why}  # its upload is the abort note
        cl = self._session(ctx.client_id, ctx.round_idx)
        if not all_finite(delta):  # diverged: drop out, send no input
            return {}, {"codec": self.name, "withheld": "the update is not finite"}
        w = self.mean.weight(self.num_examples[ctx.client_id])
        x = (delta.to(torch.float64) * w).clamp(-self.bound, self.bound).numpy()
        try:
            y = cl.masked_input(x)
        except ProtocolError as exc:
            self.sessions.pop(ctx.client_id, None)
            self.aborted[ctx.client_id] = str(exc)
            return {}, {"codec": self.name, ABORT: str(exc)}
        meta = {"codec": self.name, "frac_bits": self.fp.frac_bits, "bits": self.fp.bits}
        return {"masked": torch.from_numpy(pack_words(y, self.fp.bits))}, meta

    def rebuild(self, got: Received) -> torch.Tensor:
        raise UploadError("a masked update alone cannot be decoded: only the cohort's sum can")

    def decode_masked(
        self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], size: int
    ) -> np.ndarray:
        """The masked vector of an update as uint64 words below 2^k (sent packed,
        k bits a word)."""
        if "withheld" in meta:  # the client dropped out instead (e.g. a diverged run)
            raise UploadError(f"secure aggregation: no masked input: {meta['withheld']!s:.100}")
        if ABORT in meta:  # the client aborted the round
            raise UploadError(f"secure aggregation: {meta[ABORT]!s:.300} (at 'masked_input')")
        expect_codec(meta, self.name, tensors, self.sends)
        got = (meta.get("bits"), meta.get("frac_bits"))
        if got != (self.fp.bits, self.fp.frac_bits):
            raise UploadError(
                f"masked update in fixed point (bits, frac_bits) = {got!r:.60}; this round's "
                f"is ({self.fp.bits}, {self.fp.frac_bits})"
            )
        nbytes = (size * self.fp.bits + 7) // 8
        packed = expect_tensor(tensors, "masked", (nbytes,), torch.uint8).numpy()
        return unpack_words(packed, self.fp.bits, size)


def _round_of(data: bytes) -> int | None:
    """The round a phase message is labelled with, None when it cannot be read."""
    try:
        r = wire.decode(data).meta.get("round_idx")
    except UploadError:
        return None
    return r if isinstance(r, int) else None

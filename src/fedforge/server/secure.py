"""The server's side of a secure-aggregation round (Bonawitz et al. 2017): the
four phases through the engine, the masked uploads, the unmasked sum.

advertise keys -> share keys (the server routes the encrypted shares) -> masked
input (the routed shares go out, the cohort trains and uploads masked updates)
-> unmask (the survivors' shares give back the self masks of the inputs that
arrived and the pairwise masks of the clients that dropped after sharing). The
server trusts nothing: it sees public keys, ciphertexts, masked vectors and
shares; each message is checked, a malformed one counts as a dropout. Simulated
dropouts (``privacy.secagg_drop_<phase>``) come from (seed, round, phase). Fewer
than t clients at any phase end the round with the reason; the model is untouched.
With SecAgg+ (``privacy.secagg_neighbours``, Bell et al. 2020) each client hears
only of its neighbourhood in the round's graph, and a client with fewer than t
of its neighbourhood left ends the round the same way, naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedforge.client.runtime import ClientTask
from fedforge.config.privacy import secagg_drops
from fedforge.core import wire
from fedforge.core.errors import UploadError
from fedforge.core.rng import numpy_rng
from fedforge.privacy import secagg_codec as sc
from fedforge.privacy.dp import DPMean
from fedforge.privacy.secagg import route, unmask_sum
from fedforge.server.experiment import Experiment
from fedforge.server.labels import read_labels
from fedforge.store import ClientRecord


@dataclass
class SecureOutcome:
    """The aggregate (None: the round ended) and what crossed the wire."""

    aggregate: torch.Tensor | None
    reason: str | None
    clients: dict[int, ClientRecord] = field(default_factory=dict)  # inputs in the sum
    bytes_up: int = 0  # masked updates and phase replies, every client
    bytes_down: int = 0  # phase messages and the payload, to the clients that got them
    refused: list[tuple[int, str]] = field(default_factory=list)  # malformed messages
    payloads: int = 0  # clients the model went to
    masked_updates: int = 0  # masked updates that arrived, well-formed or not


def dropped(seed: int, round_idx: int, phase: str, fraction: float, alive: list[int]) -> set[int]:
    """The simulated dropouts before ``phase``: round(fraction * alive) clients."""
    n = int(round(fraction * len(alive)))
    if n == 0:
        return set()
    pick = numpy_rng(seed, "secagg_drop", round_idx, phase).choice(len(alive), n, replace=False)
    return {alive[i] for i in pick.tolist()}


def secure_round(
    exp: Experiment, round_idx: int, tasks: Sequence[ClientTask], payload: bytes
) -> SecureOutcome:
    """One round's secure aggregation over the clients of ``tasks``."""
    assert exp.privacy is not None and exp.privacy.secagg is not None
    codec, cfg, size = exp.privacy.secagg, exp.cfg, exp.spec.size
    t = codec.threshold_of(len(tasks))
    out = SecureOutcome(None, None)
    up: dict[int, int] = {}
    down: dict[int, int] = {}
    drops = secagg_drops(cfg.privacy)

    def alive(phase: str, ids: Sequence[int]) -> list[int]:
        gone = dropped(cfg.seed, round_idx, phase, drops[phase], sorted(ids))
        return [c for c in sorted(ids) if c not in gone]

    def send(phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        for c, m in messages.items():
            down[c] = down.get(c, 0) + len(m)
        replies = exp.engine.run_phase(phase, messages)
        for c, r in replies.items():
            up[c] = up.get(c, 0) + len(r)
        return replies

    def parse(replies: Mapping[int, bytes], fn: Callable[[int, bytes], Any]) -> dict[int, Any]:
        got: dict[int, Any] = {}
        for c, r in replies.items():
            try:
                got[c] = fn(c, r)
            except UploadError as exc:  # a malformed reply counts as a dropout
                why = str(exc)
                prefix = "secure aggregation: "
                out.refused.append((c, why if why.startswith(prefix) else prefix + why))
        return got

    def end(phase: str, alive: Sequence[int], whose: Sequence[int]) -> SecureOutcome | None:
        """The round's end when too few are ``alive`` after ``phase``, overall or
        in the neighbourhood of one of ``whose``; None: go on."""
        why = graph.shortfall(alive, whose, phase, t)
        if why is None:
            return None
        out.reason = why
        if phase in ("masked_input", "unmask"):
            out.clients = {}
        return finish()

    def finish() -> SecureOutcome:
        out.bytes_up, out.bytes_down = sum(up.values()), sum(down.values())
        for c, rec in out.clients.items():
            out.clients[c] = ClientRecord(
                rec.round_idx,
                c,
                rec.num_examples,
                rec.train_loss,
                rec.update_norm,
                rec.bytes_up + up.get(c, 0),
                down.get(c, 0),
            )
        return out

    ids = [task.client_id for task in tasks]
    if len(ids) < 2:  # the "sum" of one client is its update
        out.reason = f"secure aggregation: {len(ids)} client(s) in the round; it needs at least 2"
        return finish()
    if t > len(ids):  # distributed DP: fewer clients than its noise is calibrated to
        out.reason = (
            f"secure aggregation: {len(ids)} client(s) in the round, fewer than t = {t} "
            "(distributed DP's n_min)"
        )
        return finish()
    graph = codec.graph(round_idx, ids)
    msg = sc.advertise_message(round_idx, None if codec.neighbours is None else ids)
    replies = send("advertise", {c: msg for c in alive("advertise", ids)})
    keys = parse(replies, lambda c, r: sc.read_keys(r, round_idx, c))
    u1 = sorted(keys)
    if stop := end("advertise", u1, u1):
        return stop
    replies = send(
        "share_keys",
        {
            c: sc.share_keys_message(round_idx, {i: keys[i] for i in graph.within(c, u1)}, graph.t)
            for c in alive("share_keys", u1)
        },
    )
    shares = parse(replies, lambda c, r: sc.read_shares(r, round_idx, c, graph.within(c, u1)))
    u2 = sorted(shares)
    if stop := end("share_keys", u2, u2):
        return stop
    routed = route(shares)
    live = alive("masked_input", u2)
    if stop := end("masked_input", live, u2):  # too few to train for: none does
        return stop
    send(
        "masked_input",
        {c: sc.masked_input_message(round_idx, routed[c], graph.within(c, u2)) for c in live},
    )
    masked: dict[int, np.ndarray] = {}
    weights: dict[int, int] = {}
    for c in live:  # the model goes to the clients still in the protocol, only
        down[c] = down.get(c, 0) + len(payload)
    out.payloads = len(live)
    for upload in exp.engine.run_cohort(
        [task for task in tasks if task.client_id in live], payload
    ):
        c = upload.client_id
        up[c] = up.get(c, 0) + len(upload.data)
        out.masked_updates += 1
        try:
            upd = wire.decode(upload.data)
            n, loss = read_labels(upd.meta, c, round_idx)
            masked[c] = codec.decode_masked(upd.tensors, upd.meta, size)
        except UploadError as exc:
            out.refused.append((c, str(exc)))
            continue
        weights[c] = n
        # the server cannot know an individual update's norm: NaN
        out.clients[c] = ClientRecord(round_idx, c, n, loss, float("nan"), 0, 0)
    u3 = sorted(masked)
    if stop := end("masked_input", u3, u2):
        return stop
    if split := graph.split(u3):  # SecAgg+: groups would be unmasked one by one
        out.reason, out.clients = split, {}
        return finish()
    replies = send(
        "unmask",
        {c: sc.unmask_message(round_idx, graph.within(c, u3)) for c in alive("unmask", u3)},
    )
    shares_back = parse(replies, lambda c, r: sc.read_unmask(r, round_idx, c, graph.within(c, u2)))
    if stop := end("unmask", sorted(shares_back), u2):
        return stop
    total, why = unmask_sum(masked, shares_back, keys, u2, graph, codec.fp, round_idx, size)
    if total is None:
        out.clients, out.reason = {}, why
        return finish()
    summed = torch.from_numpy(codec.fp.decode(total)).to(exp.initial_params.dtype)
    agg = exp.pipeline.aggregator
    if not isinstance(agg, sc.SecAggMean | DPMean):  # refused at build time
        raise TypeError(f"secure aggregation cannot aggregate with '{agg.name}'")
    out.aggregate = agg.from_sum(summed, [weights[c] for c in u3])
    return finish()

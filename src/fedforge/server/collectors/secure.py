"""The secure-aggregation collector (Bonawitz et al. 2017): a state machine over
the protocol's four phases, whose messages arrive one at a time.

advertise keys -> share keys (the server routes the encrypted shares) -> masked
input (the routed shares go out, the live clients train and upload masked
updates) -> unmask (the survivors' shares give back the self masks of the inputs
that arrived and the pairwise masks of the clients that dropped after sharing).
The server trusts nothing: it sees public keys, ciphertexts, masked vectors and
shares; each message is checked, and a malformed one counts as a dropout. Fewer
than t clients at any phase end the round with the reason; the model is
untouched. With SecAgg+ (``privacy.secagg_neighbours``, Bell et al. 2020) each
client hears only of its neighbourhood in the round's graph, and a client with
fewer than t of its neighbourhood left ends the round the same way, naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fedforge.config.compat import cohort_size
from fedforge.core import wire
from fedforge.core.errors import EngineError, UploadError
from fedforge.engines.partial import PartialSum, Summing
from fedforge.pipeline.pipeline import StageContext
from fedforge.privacy import secagg_codec as sc
from fedforge.privacy import secagg_wire as sw
from fedforge.privacy.dp import DPMean
from fedforge.privacy.secagg import PHASES
from fedforge.privacy.secagg_server import route, unmask_sum
from fedforge.server.collectors.base import Collected, DenseCost, Phase, RoundLog
from fedforge.server.experiment import Experiment
from fedforge.server.update_header import read_update_header
from fedforge.store import ClientRecord

PREFIX = "secure aggregation: "


class SecureSum:
    """One round's secure aggregation over the clients that were given tasks."""

    def __init__(
        self,
        exp: Experiment,
        round_idx: int,
        trainers: Sequence[int],
        log: RoundLog,
        payload_bytes: int,
        dense: DenseCost,
    ) -> None:
        assert exp.privacy is not None and exp.privacy.secagg is not None
        self.exp, self.round_idx, self.log, self.dense = exp, round_idx, log, dense
        self.codec = exp.privacy.secagg
        self.payload_bytes = payload_bytes
        self.ids = sorted(trainers)
        self.t = self.codec.threshold_of(len(self.ids))
        self.up: dict[int, int] = {}
        self.down: dict[int, int] = {}
        self.gone: set[int] = set()
        self.phase = -1  # index into PHASES of the phase under way
        self.open = False  # its messages are out and its answers not yet closed
        self.reason: str | None = self._refuse_cohort()
        self.graph = self.codec.graph(round_idx, self.ids) if self.reason is None else None
        self.addressed: list[int] = []
        self.keys: dict[int, Any] = {}
        self.shares: dict[int, Any] = {}
        self.shares_back: dict[int, Any] = {}
        self.masked: dict[int, np.ndarray] = {}
        self.clients: dict[int, ClientRecord] = {}  # the masked inputs that arrived
        # each input's num_examples: the clients weighed their own inputs by them
        # (uniform or capped at 1 a client: SecAggMean), so the server divides alike
        self.weights: dict[int, int] = {}
        self.payloads = self.masked_updates = 0
        self.aggregate: torch.Tensor | None = None

    def _refuse_cohort(self) -> str | None:
        n = len(self.ids)
        if n < 2:  # the "sum" of one client is its update
            return f"{PREFIX}{n} client(s) in the round; it needs at least 2"
        if self.t > n:  # distributed DP: fewer clients than its noise is calibrated to
            return (
                f"{PREFIX}{n} client(s) in the round, fewer than t = {self.t} "
                "(distributed DP's n_min)"
            )
        return None

    def _survivors(self) -> list[int]:
        """Who the next phase addresses: the clients that answered the last one."""
        if self.phase < 0:
            return self.ids
        return sorted((self.keys, self.shares, self.masked, self.shares_back)[self.phase])

    def upcoming(self) -> tuple[str, list[int]] | None:
        if self.reason is not None or self.phase + 1 >= len(PHASES):
            return None
        return PHASES[self.phase + 1], self._survivors()

    def next_phase(self) -> Phase | None:
        if self.upcoming() is None:
            return None
        addressed = self._survivors()
        self.phase += 1
        self.open = True
        live = [c for c in addressed if c not in self.gone]
        self.addressed = live
        name = PHASES[self.phase]
        if name == "masked_input" and self._end(live, addressed):  # too few to train for
            return None
        messages = {c: self._message(name, c, addressed) for c in live}
        for c, m in messages.items():
            self.down[c] = self.down.get(c, 0) + len(m)
        if name != "masked_input":
            return Phase(name, messages)
        for c in live:  # the model goes to the clients still in the protocol, only
            self.down[c] = self.down.get(c, 0) + self.payload_bytes
        self.payloads = len(live)
        return Phase(name, messages, train=live)

    def _message(self, name: str, c: int, ids: list[int]) -> bytes:
        graph, r = self.graph, self.round_idx
        assert graph is not None
        if name == "advertise":
            return sw.advertise_message(r, None if self.codec.neighbours is None else ids)
        if name == "share_keys":
            return sw.share_keys_message(
                r, {i: self.keys[i] for i in graph.within(c, ids)}, graph.t
            )
        if name == "masked_input":
            return sw.masked_input_message(r, self.routed[c], graph.within(c, ids))
        return sw.unmask_message(r, graph.within(c, ids))

    def _unexpected(self, c: int, what: str) -> str | None:
        """Why a message of client ``c`` is not taken now, or None."""
        if not self.open or c not in self.addressed or c in self.gone:
            return f"{PREFIX}client {c}'s {what} was not asked for now"
        return None

    def reply(self, client_id: int, data: bytes) -> None:
        c, r, graph = client_id, self.round_idx, self.graph
        self.up[c] = self.up.get(c, 0) + len(data)
        why = self._unexpected(c, "reply")
        if why is not None or graph is None:
            self.log.reject(c, why or f"{PREFIX}no phase is under way")
            return
        name = PHASES[self.phase]
        u1, u2 = sorted(self.keys), sorted(self.shares)
        readers: dict[str, tuple[dict[int, Any], Callable[[], Any]]] = {
            "advertise": (self.keys, lambda: sw.read_keys(data, r, c)),
            "share_keys": (self.shares, lambda: sw.read_shares(data, r, c, graph.within(c, u1))),
            "unmask": (self.shares_back, lambda: sw.read_unmask(data, r, c, graph.within(c, u2))),
        }
        if name not in readers:  # the masked-input phase asks for no reply
            return
        into, read = readers[name]
        if c in into:  # the first answer stands
            self.log.reject(c, f"{PREFIX}a second reply to '{name}' is ignored")
            return
        try:
            into[c] = read()
        except UploadError as exc:  # a malformed reply counts as a dropout
            why = str(exc)
            self.log.reject(c, why if why.startswith(PREFIX) else PREFIX + why)

    holds = False  # a masked update is judged as it comes (its sum only at the end)

    def offer(self, client_id: int, data: bytes) -> str | None:
        c = client_id
        self.up[c] = self.up.get(c, 0) + len(data)
        why = self._unexpected(c, "masked update")
        if why is None and (PHASES[self.phase] != "masked_input" or c in self.masked):
            why = f"{PREFIX}client {c}'s masked update was not asked for now"
        if why is not None:
            self.log.reject(c, why)
            return why
        self.masked_updates += 1  # a masked update of the phase arrived, well-formed or not
        try:
            upd = wire.decode(data)
            n, loss = read_update_header(upd.meta, c, self.round_idx)
            self.masked[c] = self.codec.decode_masked(upd.tensors, upd.meta, self.exp.spec.size)
        except UploadError as exc:
            self.log.reject(c, str(exc))
            return str(exc)
        self.weights[c] = n
        # the server cannot know an individual update's norm: NaN
        self.clients[c] = ClientRecord(self.round_idx, c, n, loss, float("nan"), 0, 0)
        return None

    def dropout(self, client_id: int) -> None:
        self.gone.add(client_id)

    def summing(self) -> Summing | None:
        return None  # masked inputs are summed only once all are in (the unmasking)

    def take_share(self, share: PartialSum) -> list[int]:
        raise EngineError("secure aggregation takes no worker's summed uploads")

    def end_phase(self) -> None:
        if not self.open:
            return
        self.open = False
        name = PHASES[self.phase]
        u2 = sorted(self.shares)
        if name == "advertise":
            u1 = sorted(self.keys)
            self._end(u1, u1)
        elif name == "share_keys":
            if not self._end(u2, u2):
                self.routed = route(self.shares)
        elif name == "masked_input":
            u3 = sorted(self.masked)
            if not self._end(u3, u2):
                assert self.graph is not None
                split = self.graph.split(u3)  # SecAgg+: groups would be unmasked one by one
                if split:
                    self.reason, self.clients = split, {}
        elif not self._end(sorted(self.shares_back), u2):
            self._unmask(u2)

    def _end(self, alive: Sequence[int], whose: Sequence[int]) -> bool:
        """True (the round ends) when too few are ``alive`` after the current phase,
        overall or in the neighbourhood of one of ``whose``."""
        assert self.graph is not None
        name = PHASES[self.phase]
        why = self.graph.shortfall(alive, whose, name, self.t)
        if why is None:
            return False
        self.reason = why
        if name in ("masked_input", "unmask"):
            self.clients = {}
        return True

    def _unmask(self, u2: list[int]) -> None:
        u3 = sorted(self.masked)
        assert self.graph is not None
        size = self.exp.spec.size
        total, why = unmask_sum(
            self.masked,
            self.shares_back,
            self.keys,
            u2,
            self.graph,
            self.codec.fp,
            self.round_idx,
            size,
        )
        if total is None:
            self.clients, self.reason = {}, why
            return
        summed = torch.from_numpy(self.codec.fp.decode(total)).to(self.exp.initial_params.dtype)
        # the server upload stages, linear (ShowsOnlySum), once on the sum: the sum of theirs
        summed = self.exp.pipeline.run_upload(
            summed, StageContext(self.round_idx, self.exp.cfg.seed)
        )
        agg = self.exp.pipeline.aggregator
        if not isinstance(agg, sc.SecAggMean | DPMean):  # refused at build time
            raise TypeError(f"secure aggregation cannot aggregate with '{agg.name}'")
        self.aggregate = agg.from_sum(summed, [self.weights[c] for c in u3])

    def finish(self) -> Collected:
        if self.reason is None and self.aggregate is None:  # finished before unmasking
            self.reason = f"{PREFIX}the round ended before its sum was unmasked"
        if self.reason is None and self.aggregate is not None:
            cfg = self.exp.cfg
            need = cfg.robust.min_clients_of(cohort_size(cfg.num_clients, cfg.client_fraction))
            if len(self.clients) < need:
                self.reason = (
                    f"only {len(self.clients)} accepted update(s), fewer than min_clients = {need}"
                )
        if self.reason is not None:
            self.log.skip(self.reason)
            self.aggregate, self.clients = None, {}
        clients = {
            c: _with_bytes(rec, self.up.get(c, 0), self.down.get(c, 0))
            for c, rec in self.clients.items()
        }
        return Collected(
            self.aggregate,
            clients,
            [{} for _ in clients],
            sum(self.up.values()),
            sum(self.down.values()),
            self.dense.up * self.masked_updates,
            self.dense.down * self.payloads,
        )


def _with_bytes(rec: ClientRecord, up: int, down: int) -> ClientRecord:
    return ClientRecord(
        rec.round_idx,
        rec.client_id,
        rec.num_examples,
        rec.train_loss,
        rec.update_norm,
        rec.bytes_up + up,
        down,
    )

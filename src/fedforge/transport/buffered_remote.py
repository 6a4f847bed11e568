"""Buffered asynchronous aggregation (FedBuff) in ``fedforge server``: the
network's way to fill a server step's buffer (``server/buffered.py`` runs the
step: its buffer, staleness weights, aggregate, record and hooks are the
simulator's).

Up to M clients (``asynchronous.concurrency``) are at work at once. Whenever
one answers, fails (its process gone, ``presence.py``) or misses its
``deployment.round_deadline_s``, its slot is free, and the run's selection
policy hands work on the current model to one of the connected clients neither
at work nor heard from since the last step. Each TRAIN work names the model
version it carries (the step that made the model: ``Work.model_version`` and
the round of its key); the server keeps which version it handed to which
client, and that record, not the upload's word, is the version the update's
staleness is counted from (an upload naming another version is refused by the
book of questions, ``questions.py``, with the reason). An update more than
``asynchronous.max_staleness`` steps stale is refused by the buffer, the
reason in the round's refusals and the uploader's verdict. Each version's
payload is served once under its own id and withdrawn as soon as no client at
work holds it and a newer one is served.

The wall clock takes the virtual clock's place: a step's time in
``buffered_rounds`` is the seconds since the run began, the run's resumes
counted from their checkpoint's time. The clients at work are this process's:
a server stopped and resumed continues from its last checkpoint (written
between steps, so with an empty buffer) with none at work; the work its
predecessor handed out is no question of the new server's, and an upload of
it is refused as not asked for, so no update trained from a model the
checkpoint never saw can enter the resumed run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedforge.config import Config
from fedforge.server.buffered import Filling
from fedforge.server.buffered_state import InFlight
from fedforge.transport.client_times import bounded_times
from fedforge.transport.hub import Hub
from fedforge.transport.ids import logged_ids
from fedforge.transport.logs import log_event
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.remote import RemoteEngine, plan_json
from fedforge.transport.work import TRAINING_PAYLOAD, UPDATE, Answer, Key

POLL_S = 0.5  # how long one wait for an answer lasts before the slots are looked at


@dataclass(frozen=True)
class Job:
    """Work handed to a client: its question, the model version it carries, and
    when it was handed (the run's seconds) and is due (the hub's clock)."""

    key: Key
    version: int
    started: float
    due: float


class BufferedRemoteEngine(RemoteEngine):
    """``RemoteEngine`` whose server steps are buffered: ``fill_buffer``."""

    def __init__(
        self,
        hub: Hub,
        cfg: Config,
        on_round: Callable[[float], None] | None = None,
        on_store: Callable[[Path], None] | None = None,
    ) -> None:
        super().__init__(hub, cfg, on_round, on_store)
        self.seed = cfg.seed
        self.at_work: dict[int, Job] = {}  # by client id
        self.served: dict[int, str] = {}  # model version -> its payload id
        self._origin: float | None = None  # the hub's clock at the run's second 0

    def elapsed(self) -> float:
        assert self._origin is not None
        return self.hub.clock() - self._origin

    def fill_buffer(self, f: Filling) -> tuple[list[InFlight], int]:
        """Fill step ``f``'s buffer from the clients' answers (the module's
        docstring): the clients heard from and how many were handed work."""
        hub, buffer = self.hub, f.buffer
        r = f.orders.round_idx
        if self._origin is None:  # the run's clock goes on from its checkpoint's time
            self._origin = hub.clock() - f.buffered.now
        if self.on_round is not None and self._began is not None:
            self.on_round(hub.clock() - self._began)
        self._began = hub.clock()
        hub.set_phase(f"step {r + 1}: {len(self.at_work)} clients at work")
        heard: list[InFlight] = []
        sent = 0
        idle_since: float | None = None
        while not buffer.full:
            free = f.concurrency - len(self.at_work)
            if free > 0:
                sent += self._dispatch(f, free, {e.client_id for e in heard})
            self._withdraw_unused(r)
            if not self.at_work:  # nobody at work, nobody to hand work to: wait a while
                idle_since = hub.clock() if idle_since is None else idle_since
                if hub.clock() - idle_since >= self.live_wait_s:
                    f.log.write(
                        f"no client is at work and none may be handed work within "
                        f"{self.live_wait_s:g} s; the buffer closes with "
                        f"{len(buffer.clients) + len(buffer.held)} of {buffer.size}"
                    )
                    break
                hub.wait_for(len(hub.alive()) + 1, POLL_S, live=True)
                continue
            idle_since = None
            a = hub.next_answer({j.key for j in self.at_work.values()}, POLL_S)
            if a is not None:
                heard.append(self._arrived(f, a))
            heard += self._lapsed(r)
        f.buffered.now = self.elapsed()
        return heard, sent

    def _dispatch(self, f: Filling, free: int, heard: set[int]) -> int:
        """Hand the current model to up to ``free`` connected clients neither at
        work nor in ``heard``, drawn by the selection policy: how many."""
        hub, orders = self.hub, f.orders
        pool = [c for c in hub.alive() if c not in self.at_work and c not in heard]
        size = min(free, len(pool))
        if size == 0:
            return 0
        cohort = f.draw(pool, size)
        r, payload = orders.round_idx, orders.payload
        pid = self.served.get(r)
        if pid is None:
            pid = self.served[r] = f"{TRAINING_PAYLOAD}{r}"
            hub.serve(pid, payload, alone=False)
        self.version = r
        works = [
            pb.Work(
                kind=pb.Work.TRAIN,
                client_id=c,
                round_idx=r,
                model_version=r,
                plan_json=plan_json(orders.plan),
                seed=self.seed,
                payload_id=pid,
                payload_size=len(payload),
                deadline_s=self.deadline_s,
            )
            for c in cohort
        ]
        hub.ask(works, r)
        started, due = self.elapsed(), hub.clock() + self.deadline_s
        for c in cohort:
            self.at_work[c] = Job((c, r, UPDATE, ""), r, started, due)
        log_event("server", "buffered_work", step=r + 1, version=r, clients=logged_ids(cohort))
        hub.set_phase(f"step {r + 1}: {len(self.at_work)} clients at work")
        return len(cohort)

    def _arrived(self, f: Filling, a: Answer) -> InFlight:
        """An update offered to the buffer with the version the server handed out;
        its uploader told the verdict (at the step's end when the buffer holds it)."""
        job = self.at_work.pop(a.client_id)
        r = f.orders.round_idx
        why = f.buffer.offer_from(a.client_id, job.version, a.data)
        if why is None and f.buffer.holds:
            f.held.append((a.client_id, a.verdict.settle))
        else:
            a.verdict.settle(why)
        log_event(
            "server",
            "buffered_update",
            client=a.client_id,
            step=r + 1,
            version=job.version,
            staleness=r - job.version,
            taken=why is None,
            reason=why,
        )
        now = self.elapsed()
        m, refused = bounded_times(a.reported, now - job.started)
        if refused is not None:
            log_event("server", "times_refused", client=a.client_id, step=r + 1, reason=refused)
        # the bytes were offered above: a step keeps only whether they came
        return InFlight(
            now, a.client_id, job.version, job.started, m.download_s, m.compute_s, m.upload_s, b""
        )

    def _lapsed(self, r: int) -> list[InFlight]:
        """The clients at work past their deadline or gone: dropouts, slots free."""
        now = self.hub.clock()
        gone = [c for c, j in self.at_work.items() if now >= j.due or self.hub.silent(j.key)]
        if not gone:
            return []
        jobs = [self.at_work.pop(c) for c in gone]
        self.hub.dropped({j.key for j in jobs})
        log_event("server", "buffered_dropouts", step=r + 1, clients=logged_ids(sorted(gone)))
        t = self.elapsed()
        nan = math.nan
        return [InFlight(t, j.key[0], j.version, j.started, nan, nan, nan, None) for j in jobs]

    def tell_commit(self, next_round: int) -> None:
        """Nothing to commit: no client keeps state from step to step under
        buffered aggregation (``server/buffered.py:check_buffered`` refuses it)."""

    def close(self) -> None:
        """The work still out is withdrawn: its uploads are refused as not asked for."""
        self.hub.close({j.key for j in self.at_work.values()})
        self.at_work.clear()

    def _withdraw_unused(self, r: int) -> None:
        """Keep only the current version's payload and those of clients at work."""
        held = {j.version for j in self.at_work.values()} | {r}
        for v in [v for v in self.served if v not in held]:
            self.hub.withdraw(self.served.pop(v))


__all__ = ["BufferedRemoteEngine", "Job"]

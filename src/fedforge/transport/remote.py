"""The deployment server's engine: a round's work goes to client processes over
the network instead of function calls (DESIGN idea 4: engines change where,
not what).

``run_cohort`` posts a TRAIN work item per task (the payload is served for
download under an id) and yields the updates as they arrive; ``run_phase``
posts a protocol phase's messages and returns the replies that came. Both wait
at most ``deployment.round_deadline_s``, and stop early when every client still
owing an answer is gone (its connection closed, or no call within its own
heartbeat pauses or ``heartbeat_timeout_s``: ``presence.py``): the ones that
did not answer are dropouts, which the
round's collector treats as in simulation (secure aggregation recovers their
masks from the survivors' shares). Under over-selection the server asks more
clients than the round needs and ``run_cohort`` closes at the needed count.

A round samples only the clients whose process is there (``sampling_pool``),
and records the bytes that crossed the wire (``sent_down``), not a payload for
every cohort client. Which of them may be asked is the round's to say (the
rollout hook's gate, transport/rollout.py): the engine asks whom it is given.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from fedforge.algorithms.plan import LocalPlan
from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config import Config
from fedforge.engines import Rows
from fedforge.engines.partial import PartialSum, Summing
from fedforge.selection.sampling import cohort_size
from fedforge.store import RunStore
from fedforge.transport.client_times import Arrival, round_rows
from fedforge.transport.hub import Hub
from fedforge.transport.ids import logged_ids
from fedforge.transport.logs import log_event
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.presence_log import PresenceLog
from fedforge.transport.work import REPLY, TRAINING_PAYLOAD, UPDATE, Key


def plan_json(plan: LocalPlan) -> str:
    return json.dumps(asdict(plan), sort_keys=True)


def plan_from_json(text: str) -> LocalPlan:
    return LocalPlan(**json.loads(text))


class RemoteEngine:
    """Runs a cohort on the clients connected to ``hub``."""

    name = "remote"

    def __init__(
        self,
        hub: Hub,
        cfg: Config,
        on_round: Callable[[float], None] | None = None,
        on_store: Callable[[Path], None] | None = None,
    ) -> None:
        self.hub = hub
        self.on_round = on_round  # told each round's wall time (the metrics)
        self.on_store = on_store  # told the run's folder (the live-state file)
        self._began: float | None = None
        self.deadline_s = cfg.deployment.round_deadline_s
        # the server samples this fraction more clients than a round needs
        self.over_selection = cfg.deployment.over_selection
        needed = cohort_size(cfg.num_clients, cfg.client_fraction)
        self.needed = needed if self.over_selection > 0 else None
        self.version = 0  # the model version being served (the round that made it)
        self.round_idx = 0
        self.commit: tuple[int, list[int]] | None = None  # (round, used) not yet told
        self.store: RunStore | None = None
        self.live_wait_s = cfg.deployment.live_wait_s
        self._sent = (0, 0)  # the hub's training bytes down and downloads at the last record
        self._times: Rows = {}  # the round's measured client times (client_times.py)
        self.presence = PresenceLog(hub)  # who was there, in the run store

    def sampling_pool(self, round_idx: int, need: int) -> list[int]:
        """The clients round ``round_idx`` may sample: those whose process is there
        (``presence.py``). With fewer than ``need``, it waits up to
        ``deployment.live_wait_s`` for them (the round is skipped if they do not
        come)."""
        live = self.hub.alive()
        if len(live) < need and self.live_wait_s > 0:
            self.hub.set_phase(f"round {round_idx + 1}: waiting for {need} connected clients")
            log_event(
                "server",
                "waiting_for_clients",
                round=round_idx + 1,
                connected=logged_ids(live),
                need=need,
                wait_s=self.live_wait_s,
            )
            self.hub.wait_for(need, self.live_wait_s, live=True)
            live = self.hub.alive()
        self.presence.write()  # on record even when the round is skipped for too few
        return live

    def sent_down(self) -> tuple[int, int]:
        """Bytes down since the last call (models downloaded to the end, protocol
        messages handed out) and the number of those downloads: a round's record."""
        hub = self.hub
        with hub.cond:
            now = (hub.bytes_down + hub.message_bytes_down, hub.downloads)
        was, self._sent = self._sent, now
        return now[0] - was[0], now[1] - was[1]

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        if not tasks:
            return
        r = tasks[0].round_idx
        pid = f"{TRAINING_PAYLOAD}{r}"
        self.hub.serve(pid, payload)
        self.version = r
        works = [
            pb.Work(
                kind=pb.Work.TRAIN,
                client_id=t.client_id,
                round_idx=r,
                model_version=self.version,
                plan_json=plan_json(t.plan),
                seed=t.seed,
                payload_id=pid,
                payload_size=len(payload),
                deadline_s=self.deadline_s,
            )
            for t in tasks
        ]
        keys: set[Key] = {(t.client_id, r, UPDATE, "") for t in tasks}
        self.hub.set_phase(f"round {r + 1}: training")
        self.hub.ask(works, self.version)
        need = None if self.needed is None else min(self.needed, len(tasks))
        # closed with this generator: the answers read and never judged (the round
        # stopped) are refused at once, not left to their uploaders' wait
        arrivals: dict[int, Arrival] = {}
        try:
            with contextlib.closing(self.hub.gather(keys, self.deadline_s, need)) as answers:
                for a in answers:
                    arrivals[a.client_id] = Arrival(a.seconds, len(a.data), a.reported)
                    yield ClientUpload(a.client_id, a.data, a.seconds, a.verdict.settle)
        finally:
            self._timed(r, tasks, len(payload), arrivals, need)

    def run_summed(
        self, tasks: Sequence[ClientTask], payload: bytes, summing: Summing
    ) -> Iterator[PartialSum] | None:
        return None  # every upload crosses the network to this server

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        """Each addressed client's reply; a client answers every phase message (an
        empty reply: it has nothing to say, as in the masked-input phase, whose
        messages set up the update that follows)."""
        if not messages:
            return {}
        r = self.round_idx
        works = [
            pb.Work(
                kind=pb.Work.PHASE,
                client_id=c,
                round_idx=r,
                model_version=self.version,
                phase=phase,
                message=m,
                deadline_s=self.deadline_s,
            )
            for c, m in messages.items()
        ]
        keys: set[Key] = {(c, r, REPLY, phase) for c in messages}
        self.hub.set_phase(f"round {r + 1}: {phase}")
        self.hub.ask(works, self.version)
        return {a.client_id: a.data for a in self.hub.gather(keys, self.deadline_s) if a.data}

    def begin_round(self, round_idx: int) -> None:
        """The upload round whose phases come next (protocol phases precede the
        payload): the last one's wall time told, its commits posted."""
        self.round_idx = round_idx
        now = time.monotonic()
        if self._began is not None and self.on_round is not None:
            self.on_round(now - self._began)
        self._began = now
        self.tell_commit(round_idx)

    def declared_sizes(self) -> list[int]:
        """Each client's example count as it declared it when it joined (0: not
        yet): the sizes of a federation whose clients bring their own data."""
        return self.hub.declared()

    def bind_store(self, store: RunStore) -> None:
        """The run's store: a resumed server reads the commits to post again there
        (the rollout hook keeps the model versions in it)."""
        self.store = store
        self.presence.bind(store)
        if self.on_store is not None:
            self.on_store(store.path)

    def end_round(self, round_idx: int, used: Sequence[int]) -> Rows:
        """The clients whose updates the round used are to keep the state they
        computed with them (SCAFFOLD's c_k+; the others keep theirs as it was): told
        when the next upload round begins or the run ends, after the round's
        checkpoint, so that a server resumed from it never re-runs a round its
        clients have already committed. The round's measured client times, rows
        for the run store."""
        self.commit = (round_idx, list(used))
        self.presence.write()
        rows, self._times = self._times, {}
        return rows

    def _timed(
        self,
        r: int,
        tasks: Sequence[ClientTask],
        payload_bytes: int,
        arrivals: dict[int, Arrival],
        need: int | None,
    ) -> None:
        """Keep round ``r``'s client times (``client_times.py``): each asked
        client's measured seconds, examples (epochs x its declared count) and bytes."""
        declared = self.hub.declared()
        asked = [(t.client_id, t.plan.local_epochs * declared[t.client_id]) for t in tasks]
        cut = need is not None and len(arrivals) >= need  # the rest closed at the count
        rows, refused = round_rows(r, asked, payload_bytes, arrivals, dropped=not cut)
        for table, more in rows.items():
            self._times.setdefault(table, []).extend(more)
        for cid, why in refused:
            log_event("server", "times_refused", client=cid, round=r + 1, reason=why)

    def tell_commit(self, next_round: int) -> None:
        """Post the COMMITs of the last upload round before ``next_round``; a resumed
        server (nothing pending) posts again those of the newest recorded round that
        used updates (its client rows: a client that already kept that state, or
        moved on since, ignores them)."""
        if self.commit is None and self.store is not None and next_round > 0:
            last = self.store.last_used_round(next_round)
            if last is not None:
                used = [c.client_id for c in self.store.client_rounds(last)]
                self.commit = (last, used)
        if self.commit is None:
            return
        r, used = self.commit
        self.commit = None
        works = [
            pb.Work(kind=pb.Work.COMMIT, client_id=c, round_idx=r, model_version=r) for c in used
        ]
        if works:
            self.hub.ask(works, r)

    def close(self) -> None:
        """Nothing to release: the server (serve.py) decides whether the clients are
        dismissed (a finished run) or wait for a resume (a stopped one)."""


__all__ = ["RemoteEngine", "plan_from_json", "plan_json"]

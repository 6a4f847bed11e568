"""The deployment server's meeting point: what the gRPC threads and the round
thread share.

The round thread (``remote.py``) *asks*: it posts work for clients (train from a
model, answer a protocol phase, evaluate) and waits for the answers until all
came, enough came, or the deadline passed. The gRPC threads (``service.py``)
hand the work out to the polling client processes and bring the answers in.
An answer is taken only when it was asked for: the right client, round, model
version, kind and phase, once. Anything else is refused with its reason (and
counted), and never reaches a collector; the collector then checks what it
does take, as in simulation. One lock guards it all; waiting is on its
condition.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.work import (
    ACKNOWLEDGEMENTS,
    EVALUATION,
    KINDS,
    REPLY,
    SERVED,
    SERVING,
    TRAINING_PAYLOAD,
    Answer,
    Asked,
    Key,
    Member,
)


@dataclass
class Hub:
    """Clients, outstanding questions and answers of one deployment server."""

    num_clients: int
    heartbeat_timeout_s: float
    on_refusal: Callable[[str, int | None, str], None] = lambda who, client, why: None
    clock: Callable[[], float] = time.monotonic
    # the ids each authenticated name may host (members.json); None: first come
    allowed: Mapping[str, frozenset[int]] | None = None
    members: dict[int, Member] = field(default_factory=dict)
    sessions: dict[str, str] = field(default_factory=dict)  # session -> owner
    payloads: dict[str, bytes] = field(default_factory=dict)
    done: bool = False
    done_reason: str = ""
    bytes_down: int = 0  # training payload bytes handed out (the rounds' models)
    bytes_up: int = 0  # training answer bytes taken (updates, protocol replies)
    eval_bytes_down: int = 0  # models sent for evaluation (cold start, canary)
    eval_bytes_up: int = 0  # evaluation reports taken
    accepted: int = 0  # answers taken
    phase: str = "waiting for clients"  # what the round thread awaits (metrics, logs)
    # questions unanswered when their round closed on its deadline or its clients' silence
    dropouts: int = 0  # (not those closed at an over-selected count)
    # told when a client joins, the phase moves on or questions go unanswered (the
    # live-state file); called under the hub's lock, so it must not block
    on_change: Callable[[], None] = lambda: None

    def __post_init__(self) -> None:
        self.cond = threading.Condition()
        self._pending: dict[int, list[Key]] = {}  # per client: work not handed out yet
        self._asked: dict[Key, Asked] = {}
        self._answered: set[Key] = set()
        self._inbox: list[Answer] = []
        self._latest = 0  # the newest round asked about
        self._given: dict[str, set[str]] = {}  # session -> payload ids its work named
        self._dismissed: set[str] = set()  # sessions told the run is over

    # ------------------------------------------------------------- gRPC threads
    def join(
        self, owner: str, members: list[tuple[int, int]], evals: Mapping[int, int] | None = None
    ) -> tuple[str, list[int], list]:
        """Register ``owner``'s client ids, each with its count of training examples
        and, in ``evals``, of evaluation ones (absent or 0: the same): a new session,
        the ids accepted and the (id, reason) refused (``_refuse_member``)."""
        if len(members) > self.num_clients:
            raise ValueError(
                f"a join of {len(members)} client ids; this federation has {self.num_clients}"
            )
        with self.cond:
            session = secrets.token_hex(16)
            self.sessions[session] = owner
            accepted, refused = [], []
            for cid, n in members:
                e = (evals or {}).get(cid, 0)
                why = self._refuse_member(owner, cid, n, e)
                if why is not None:
                    refused.append((cid, self._refuse(owner, cid, why)))
                    continue
                self.members[cid] = Member(cid, owner, n, session, self.clock(), e or n)
                self._reissue(cid)
                accepted.append(cid)
            live = {m.session for m in self.members.values()}
            for old in [s for s in self.sessions if s not in live and s != session]:
                del self.sessions[old]  # a session whose clients all joined again elsewhere
                self._given.pop(old, None)
            self.cond.notify_all()
            self.on_change()
            return session, accepted, refused

    def _reissue(self, cid: int) -> None:
        """A client joining again (its process restarted) is given again the update
        or evaluation it had been handed and not answered: the old process took it
        down with it (a restarted client sends the update it saved, or computes it
        again from its saved state). Not in a secure-aggregation round: the keys of
        its protocol died with the process, so it is a dropout there (its masks are
        recovered from the shares), and ``_all_silent`` stops waiting for it."""
        protocol = {k[1] for k in (*self._asked, *self._answered) if k[0] == cid and k[2] == REPLY}
        for key, asked in self._asked.items():
            if key[0] != cid or asked.handed is None or key[2] == REPLY or key[1] in protocol:
                continue
            asked.handed, asked.session = None, ""
            pending = self._pending.setdefault(cid, [])
            if key not in pending:
                pending.append(key)

    def _refuse_member(self, owner: str, cid: int, n: int, e: int) -> str | None:
        if not 0 <= cid < self.num_clients:
            return f"client id {cid} is outside this federation's 0..{self.num_clients - 1}"
        if min(n, e) < 0:
            return f"client {cid} declared num_examples = {n}, num_eval_examples = {e}; >= 0 each"
        if self.allowed is not None and cid not in self.allowed.get(owner, ()):
            return f"client id {cid} is not among the ids '{owner}' may host (members.json)"
        held = self.members.get(cid)
        if held is not None and held.owner != owner:
            return f"client id {cid} is hosted by '{held.owner}', not '{owner}'"
        return None

    def owned(self, owner: str, session: str) -> list[int]:
        """The client ids of ``owner``'s ``session`` (KeyError: no such session)."""
        if self.sessions.get(session) != owner:
            raise KeyError(f"unknown session for '{owner}': join again")
        return [c for c, m in self.members.items() if m.session == session]

    def poll(self, owner: str, session: str, wait_s: float, heartbeat: bool) -> list[pb.Work]:
        """Work for the session's clients, waiting up to ``wait_s`` for some;
        every poll marks them alive."""
        end = self.clock() + max(0.0, min(wait_s, 60.0))
        with self.cond:
            while True:
                ids = self.owned(owner, session)
                now = self.clock()
                for c in ids:
                    self.members[c].last_seen = now
                if heartbeat:
                    return []
                work = self._hand_out(ids, now, session)
                if self.done and not work:
                    self._dismissed.add(session)
                if work or self.done or now >= end:
                    return work
                self.cond.wait(end - now)

    def _hand_out(self, ids: list[int], now: float, session: str) -> list[pb.Work]:
        out = []
        for c in ids:
            for key in self._pending.pop(c, []):
                asked = self._asked.get(key)
                if asked is None:  # closed before it was handed out
                    continue
                asked.handed, asked.session = now, session
                if asked.work.payload_id:
                    self._given.setdefault(session, set()).add(asked.work.payload_id)
                work = pb.Work()
                work.CopyFrom(asked.work)
                work.deadline_s = max(0.0, asked.work.deadline_s - (now - asked.posted))
                out.append(work)
        return out

    def payload(self, owner: str, session: str, payload_id: str) -> bytes:
        with self.cond:
            self.owned(owner, session)
            data = self.payloads.get(payload_id)
            if data is None or payload_id not in self._given.get(session, ()):
                raise KeyError(f"payload '{payload_id}' is not served to this session now")
            if payload_id.startswith(TRAINING_PAYLOAD):
                self.bytes_down += len(data)
            else:
                self.eval_bytes_down += len(data)
            return data

    def expects(self, owner: str, header: pb.UploadHeader) -> str | None:
        """Whether an answer with ``header`` would be taken (None) or why not,
        without refusing it (the body is read only when it would be). KeyError: an
        unknown session (the client joins again)."""
        with self.cond:
            self.owned(owner, header.session)
            return self._check(owner, header, quiet=True)

    def answer(self, owner: str, header: pb.UploadHeader, data: bytes) -> str | None:
        """Take an answer: None, or the reason it is refused."""
        cid, r = header.client_id, header.round_idx
        key: Key = (cid, r, header.kind, header.phase)
        with self.cond:
            why = self._check(owner, header)
            if why is not None:
                return why
            asked = self._asked[key]
            assert asked.handed is not None
            del self._asked[key]
            self._answered.add(key)
            if header.kind in ACKNOWLEDGEMENTS:  # a COMMIT's or SERVE's: nobody waits
                return None
            seconds = self.clock() - asked.handed
            self._inbox.append(Answer(cid, r, header.kind, header.phase, data, seconds))
            self.cond.notify_all()
            return None

    def _check(self, owner: str, header: pb.UploadHeader, quiet: bool = False) -> str | None:
        """Why an answer with ``header`` from ``owner`` is not taken now (None: it
        is); ``quiet``: without counting it as a refusal."""
        refuse = (lambda o, c, why: why) if quiet else self._refuse
        cid, r = header.client_id, header.round_idx
        key: Key = (cid, r, header.kind, header.phase)
        try:
            ids = self.owned(owner, header.session)
        except KeyError as exc:
            return refuse(owner, cid, str(exc.args[0]))
        if cid not in ids:
            return refuse(owner, cid, f"client {cid} is not hosted by '{owner}'")
        if key in self._answered:
            return refuse(owner, cid, f"a second {header.kind} of client {cid} in round {r}")
        asked = self._asked.get(key)
        if asked is None or asked.handed is None:
            what = f"{header.kind}" + (f" '{header.phase}'" if header.phase else "")
            return refuse(owner, cid, f"client {cid} was not asked for a {what} in round {r} now")
        if header.model_version != asked.version:
            return refuse(
                owner,
                cid,
                f"client {cid} answered for model version {header.model_version}; "
                f"it was given version {asked.version}",
            )
        return None

    def _refuse(self, owner: str, cid: int | None, why: str) -> str:
        self.on_refusal(owner, cid, why)
        return why

    # ------------------------------------------------------------- round thread
    def set_phase(self, phase: str) -> None:
        """Say what the round thread awaits now."""
        with self.cond:
            self.phase = phase
            self.on_change()

    def acknowledged(self, key: Key) -> bool:
        """Whether the question ``key`` (of this round or the last) was answered."""
        with self.cond:
            return key in self._answered

    def serve(self, payload_id: str, payload: bytes, alone: bool = True) -> None:
        """Serve ``payload`` as ``payload_id`` (``alone``: instead of all but the serving model)."""
        with self.cond:
            if alone:
                self.payloads = {k: v for k, v in self.payloads.items() if k.startswith(SERVING)}
            self.payloads[payload_id] = payload

    def withdraw(self, payload_id: str) -> None:
        with self.cond:
            self.payloads.pop(payload_id, None)

    def ask(self, works: list[pb.Work], version: int) -> None:
        """Post ``works`` (each to its client); answers are awaited by ``gather``."""
        with self.cond:
            now = self.clock()
            for w in works:
                kind = KINDS[w.kind]
                key: Key = (
                    w.client_id,
                    w.round_idx,
                    kind,
                    w.phase if kind in (REPLY, EVALUATION, SERVED) else "",
                )
                self._asked[key] = Asked(w, version, now)
                self._answered.discard(key)
                self._pending.setdefault(w.client_id, []).append(key)
                self._latest = max(self._latest, w.round_idx)
            # answers of rounds long closed are refused as not asked; forget them,
            # and notices never acknowledged (a client gone for good)
            self._answered = {k for k in self._answered if k[1] >= self._latest - 1}
            stale = [k for k in self._asked if k[2] in ACKNOWLEDGEMENTS and k[1] < self._latest - 2]
            for k in stale:
                del self._asked[k]
            self.cond.notify_all()

    def gather(
        self, keys: set[Key], deadline_s: float, need: int | None = None
    ) -> Iterator[Answer]:
        """The answers to ``keys`` as they come, until all came, ``need`` came, the
        deadline passed, or every client still owing one has gone silent or joined
        again since (``_all_silent``); then the rest are closed (a late answer is
        refused)."""
        end = self.clock() + deadline_s
        got = 0
        try:
            while keys and (need is None or got < need):
                with self.cond:
                    mine = [a for a in self._inbox if a.key in keys]
                    if need is not None:
                        mine = mine[: need - got]
                    if not mine:
                        now = self.clock()
                        if now >= end or self._all_silent(keys, now):
                            self.dropouts += len(keys)
                            self.on_change()
                            return
                        self.cond.wait(min(end - now, 0.5))
                        continue
                    for a in mine:
                        self._inbox.remove(a)
                        keys.discard(a.key)
                        self._count(a)
                    got += len(mine)
                    if need is not None and got >= need:
                        self._close(keys)  # at once: no answer is taken past the count
                yield from mine
        finally:
            self.close(keys)

    def _count(self, a: Answer) -> None:
        """An answer the round thread takes: its bytes are on the record."""
        self.accepted += 1
        if a.kind == EVALUATION:
            self.eval_bytes_up += len(a.data)
        else:
            self.bytes_up += len(a.data)

    def _all_silent(self, keys: set[Key], now: float) -> bool:
        """Whether none of the clients owing ``keys`` can still answer: each is
        silent, or joined again (a restarted process) after its work was handed
        to its old session, whose answers are refused."""
        for key in keys:
            m = self.members.get(key[0])
            if m is None:
                continue
            asked = self._asked.get(key)
            if asked is not None and asked.handed is not None and asked.session != m.session:
                continue
            if now - m.last_seen < self.heartbeat_timeout_s:
                return False
        return True

    def close(self, keys: set[Key]) -> None:
        """Withdraw the questions ``keys`` (answered or not)."""
        with self.cond:
            self._close(keys)

    def _close(self, keys: set[Key]) -> None:
        for key in keys:
            self._asked.pop(key, None)
        # answers that came in while the round thread was busy, after the count
        # was reached: never taken, never counted
        self._inbox = [a for a in self._inbox if a.key not in keys]

    def alive(self) -> list[int]:
        """The client ids heard from within the heartbeat timeout."""
        with self.cond:
            now = self.clock()
            return sorted(
                c for c, m in self.members.items() if now - m.last_seen < self.heartbeat_timeout_s
            )

    def declared(self) -> list[int]:
        """Each client id's example count as declared when it joined (0: not joined)."""
        with self.cond:
            sizes = {c: m.num_examples for c, m in self.members.items()}
        return [sizes.get(c, 0) for c in range(self.num_clients)]

    def wait_for(self, count: int, timeout_s: float) -> int:
        """Wait until ``count`` clients joined; how many did."""
        end = self.clock() + timeout_s
        with self.cond:
            while len(self.members) < count and self.clock() < end:
                self.cond.wait(min(1.0, end - self.clock()))
            return len(self.members)

    def undismissed(self) -> int:
        """Sessions with clients heard from lately that were not yet told the run
        is over (the server waits for them before it stops listening)."""
        with self.cond:  # (the condition's lock is reentrant: alive takes it again)
            live = {self.members[c].session for c in self.alive()}
            return len(live - self._dismissed)

    def finish(self, reason: str) -> None:
        """The run is over: polls return at once, telling the clients to leave."""
        with self.cond:
            self.done, self.done_reason = True, reason
            self.cond.notify_all()

"""The deployment server's meeting point: what the gRPC threads and the round
thread share.

The round thread (``remote.py``) *asks*: it posts work for clients (train from a
model, answer a protocol phase, evaluate) and waits for the answers until all
came, enough came, the deadline passed, or every client still owing one is
gone. The gRPC side (``service.py``) hands the work out to the polling client
processes (``polls.py``: short steps under the lock; the polls wait on the event
loop, ``waits.py``) and brings the answers in; the book of questions (``questions.py``)
decides what is taken, and which client processes are there is read from their
calls (``presence.py``). Anything not asked for is refused with its reason (and
counted), and never reaches a collector; the collector then checks what it
does take, as in simulation. One lock guards it all; the round thread waits on
its condition.

Bytes are counted as they cross the wire: a model when its download was
streamed to the end, a protocol message when its work was handed out, an answer
when the round thread took it.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field

from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.polls import Polling
from fedforge.transport.presence import Presence
from fedforge.transport.questions import Questions
from fedforge.transport.spells import Spell, Spells
from fedforge.transport.work import (
    EVALUATION,
    SERVING,
    TRAINING_PAYLOAD,
    Answer,
    Key,
    Member,
    Verdict,
)


@dataclass
class Hub(Polling):
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
    bytes_down: int = 0  # training payload bytes downloaded to the end (the rounds' models)
    downloads: int = 0  # ... in that many downloads
    message_bytes_down: int = 0  # protocol messages handed out (secure aggregation's)
    bytes_up: int = 0  # training answer bytes taken (updates, protocol replies)
    eval_bytes_down: int = 0  # models downloaded for evaluation (cold start, canary, serving)
    eval_bytes_up: int = 0  # evaluation reports taken
    accepted: int = 0  # answers taken
    phase: str = "waiting for clients"  # what the round thread awaits (metrics, logs)
    # questions unanswered when their round closed on its deadline or its clients' silence
    dropouts: int = 0  # (not those closed at an over-selected count)
    # told when a client joins or goes, the phase moves on or questions go
    # unanswered (the live-state file); called under the hub's lock: must not block
    on_change: Callable[[], None] = lambda: None
    verdict_wait_s: float = 30.0  # how long an upload waits for the round's checks (its end)
    # told when pollers may have news (work asked, a join, a hang-up, the run's end
    # or the server's stop): the waiting polls look again (``polls.py``); called
    # under the hub's lock: must not block
    on_wake: Callable[[], None] = lambda: None
    halted: str = ""  # the server stops (why): polls end at once, unanswered

    def __post_init__(self) -> None:
        self.cond = threading.Condition()
        self.book = Questions()
        self.presence = Presence(self.heartbeat_timeout_s)
        self.spells = Spells()  # each client's online spells (the run store's ``presence``)
        self.watch_began = self.clock()  # since when this hub has watched who is there
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
            self.presence.joined(session, self.clock())
            accepted, refused = [], []
            for cid, n in members:
                e = (evals or {}).get(cid, 0)
                why = self._refuse_member(owner, cid, n, e)
                if why is not None:
                    refused.append((cid, self._refuse(owner, cid, why)))
                    continue
                now = self.clock()
                held = self.members.get(cid)
                if held is not None and not self.presence.live(held.session, now):
                    self._lapsed(cid, held.session, now)
                self.members[cid] = Member(cid, owner, n, session, now, e or n)
                self.spells.there(cid, now)
                self.book.reissue(cid)
                accepted.append(cid)
            live = {m.session for m in self.members.values()}
            for old in [s for s in self.sessions if s not in live and s != session]:
                del self.sessions[old]  # a session whose clients all joined again elsewhere
                self.book.given.pop(old, None)
                self.presence.forget(old)
            self.cond.notify_all()
            self.on_wake()
            self.on_change()
            return session, accepted, refused

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

    def payload(self, owner: str, session: str, payload_id: str) -> bytes:
        """The payload ``payload_id`` for ``owner``'s session (KeyError: its work did
        not name it, or it is withdrawn); counted by ``delivered``."""
        with self.cond:
            self.owned(owner, session)
            data = self.payloads.get(payload_id)
            if data is None or payload_id not in self.book.given.get(session, ()):
                raise KeyError(f"payload '{payload_id}' is not served to this session now")
            return data

    def delivered(self, payload_id: str, size: int) -> None:
        """A download of ``payload_id`` (``size`` bytes) was streamed to the end."""
        with self.cond:
            if payload_id.startswith(TRAINING_PAYLOAD):
                self.bytes_down += size
                self.downloads += 1
            else:
                self.eval_bytes_down += size

    def expects(self, owner: str, header: pb.UploadHeader) -> str | None:
        """Whether an answer with ``header`` would be taken (None) or why not,
        without refusing it (the body is read only when it would be). KeyError: an
        unknown session (the client joins again)."""
        with self.cond:
            ids = self.owned(owner, header.session)
            return self.book.check(owner, ids, header, lambda o, c, why: why)

    def answer(self, owner: str, header: pb.UploadHeader, data: bytes) -> str | None:
        """Take an answer and wait for its verdict: None, or the reason it is
        refused (an update's: the round's checks', ``collect.py``; none within
        ``verdict_wait_s``: that none came)."""
        return self.submit(owner, header, data).wait(self.verdict_wait_s)

    def submit(self, owner: str, header: pb.UploadHeader, data: bytes) -> Verdict:
        """Take an answer: its verdict, said at once when it is refused here or
        when the same answer was taken before (a repeat gets the first's)."""
        with self.cond:
            try:
                ids = self.owned(owner, header.session)
            except KeyError as exc:
                why: str | None = self._refuse(owner, header.client_id, str(exc.args[0]))
            else:
                why = self.book.check(owner, ids, header, self._refuse)
            if why is not None:
                return Verdict.said(header.client_id, header.round_idx, why)
            verdict = self.book.take(header, data, self.clock())
            self.cond.notify_all()
            return verdict

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
            return key in self.book.answered

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
            self.book.post(works, version, self.clock())
            self.cond.notify_all()
            self.on_wake()

    def gather(
        self, keys: set[Key], deadline_s: float, need: int | None = None
    ) -> Generator[Answer, None, None]:
        """The answers to ``keys`` as they come, one at a time, until all came,
        ``need`` came, the deadline passed, or every client still owing one is
        gone or joined again since (``_all_silent``); then the rest are closed (a
        late answer is refused). The caller gives each answer it read its verdict;
        if it stops reading early, those it read and did not judge are refused as
        come after their round ended."""
        end = self.clock() + deadline_s
        got: list[Verdict] = []  # of the answers read (not their bytes: the round has those)
        read_all = False
        try:
            while keys and (need is None or len(got) < need):
                with self.cond:
                    a = next((a for a in self.book.inbox if a.key in keys), None)
                    if a is None:
                        now = self.clock()
                        if now >= end or self._all_silent(keys, now):
                            self.dropouts += len(keys)
                            self.on_change()
                            break
                        self.cond.wait(min(end - now, 0.5))
                        continue
                    self.book.inbox.remove(a)
                    keys.discard(a.key)
                    self._count(a)
                    got.append(a.verdict)
                    if need is not None and len(got) >= need:
                        self.book.close(keys)  # at once: no answer is taken past the count
                yield a
            read_all = True
        finally:
            self.close(keys)
            if not read_all:  # the caller stopped: nobody will judge these
                for verdict in got:
                    verdict.late("ended")

    def _count(self, a: Answer) -> None:
        """An answer the round thread takes: its bytes are on the record."""
        self.accepted += 1
        if a.kind == EVALUATION:
            self.eval_bytes_up += len(a.data)
        else:
            self.bytes_up += len(a.data)

    def _all_silent(self, keys: set[Key], now: float) -> bool:
        """Whether none of the clients owing ``keys`` can still answer: each is
        gone (``presence.py``), or joined again (a restarted process) after its
        work was handed to its old session, whose answers are refused."""
        for key in keys:
            m = self.members.get(key[0])
            if m is None:
                continue
            asked = self.book.asked.get(key)
            if asked is not None and asked.handed is not None and asked.session != m.session:
                continue
            if self.presence.live(m.session, now):
                return False
        return True

    def close(self, keys: set[Key]) -> None:
        """Withdraw the questions ``keys`` (answered or not)."""
        with self.cond:
            self.book.close(keys)

    def next_answer(self, keys: set[Key], wait_s: float) -> Answer | None:
        """The first answer to one of ``keys`` (taken, its bytes counted), waiting
        at most ``wait_s``; None when none came. The other questions stay open
        (buffered aggregation waits on its clients at work one answer at a time)."""
        end = self.clock() + wait_s
        with self.cond:
            while True:
                a = next((a for a in self.book.inbox if a.key in keys), None)
                if a is not None:
                    self.book.inbox.remove(a)
                    self._count(a)
                    return a
                now = self.clock()
                if now >= end:
                    return None
                self.cond.wait(min(end - now, 0.5))

    def silent(self, key: Key) -> bool:
        """Whether the client owing ``key`` can no longer answer it (``_all_silent``)."""
        with self.cond:
            return self._all_silent({key}, self.clock())

    def dropped(self, keys: set[Key]) -> None:
        """Withdraw ``keys``, unanswered past their deadline or their client gone:
        dropouts."""
        with self.cond:
            self.book.close(keys)
            self.dropouts += len(keys)
            self.on_change()

    def alive(self) -> list[int]:
        """The client ids whose process is there (``presence.py``): the ones a
        round may sample. Their spells are brought up to now."""
        with self.cond:
            now = self.clock()
            there = []
            for c, m in self.members.items():
                if self.presence.live(m.session, now):
                    there.append(c)
                    self.spells.there(c, now)
                else:
                    self._lapsed(c, m.session, now)
            return sorted(there)

    def spell_rows(self) -> tuple[float, float, list[tuple[int, Spell]]]:
        """The hub's clock now, since when it watched, and the spells changed since
        the last call (every client's brought up to now first)."""
        self.alive()
        with self.cond:
            return self.clock(), self.watch_began, self.spells.changed()

    def declared(self) -> list[int]:
        """Each client id's example count as declared when it joined (0: not joined)."""
        with self.cond:
            sizes = {c: m.num_examples for c, m in self.members.items()}
        return [sizes.get(c, 0) for c in range(self.num_clients)]

    def wait_for(self, count: int, timeout_s: float, live: bool = False) -> int:
        """Wait until ``count`` clients joined (``live``: are alive); how many did."""
        end = self.clock() + timeout_s
        with self.cond:
            while (got := len(self.alive() if live else self.members)) < count:
                if self.clock() >= end:
                    break
                self.cond.wait(min(0.25 if live else 1.0, end - self.clock()))
            return got

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
            self.on_wake()

    def halt(self, reason: str) -> None:
        """The server stops without ending the run (it may be resumed): polls end
        at once, told ``reason``, and none hands out work from now on."""
        with self.cond:
            self.halted = reason
            self.cond.notify_all()
            self.on_wake()

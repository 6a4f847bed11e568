"""A client process's polls at the hub: opened, stepped, ended.

A poll asks for its session's work and, while there is none, waits: up to its
``wait_s`` (a long poll), or, for a heartbeat, up to ``presence.HOLD_S`` when no
long poll of the session is open (so that a call is open while the process
works, whose closing tells of its death). Each step is short and holds the
hub's lock; the waiting between steps is the caller's: the gRPC event loop
(``waits.py``), woken by ``on_wake`` whenever the hub has news for pollers (work
asked, a join, a hang-up, the run's end), or a thread on the hub's condition
(``poll``, for callers without a loop).

A poll remembers the keys it handed out. When its call ends before the reply
went out (the client gave up on it, its process died, the server stopped),
``end_poll`` puts exactly those back: they are pending again, for the next
poll of a live session, instead of staying handed to a reply nobody read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from fedforge.transport.ids import format_ids
from fedforge.transport.logs import log_event
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.presence import CallContext, Presence, hold_seconds
from fedforge.transport.questions import Questions, key_of
from fedforge.transport.spells import Spells
from fedforge.transport.work import Key, Member

MAX_WAIT_S = 60.0  # a long poll waits at most this long for work


@dataclass(eq=False)
class Poll:
    """One open poll: whose, until when (the hub's clock), what it handed out."""

    owner: str
    session: str
    heartbeat: bool
    token: int  # its call in ``presence``
    end: float
    handed: list[Key] = field(default_factory=list)
    over: bool = False  # its call ended unanswered: it hands out nothing more
    closed: bool = False


class Polling:
    """The hub's poll methods (``hub.Hub`` holds the state named here)."""

    cond: threading.Condition
    book: Questions
    presence: Presence
    spells: Spells
    members: dict[int, Member]
    sessions: dict[str, str]
    clock: Callable[[], float]
    done: bool
    halted: str
    message_bytes_down: int
    _dismissed: set[str]
    on_change: Callable[[], None]
    on_wake: Callable[[], None]

    def owned(self, owner: str, session: str) -> list[int]:
        """The client ids of ``owner``'s ``session`` (KeyError: no such session)."""
        if self.sessions.get(session) != owner:
            raise KeyError(f"unknown session for '{owner}': join again")
        return [c for c, m in self.members.items() if m.session == session]

    def poll(
        self,
        owner: str,
        session: str,
        wait_s: float,
        heartbeat: bool,
        call: CallContext | None = None,
    ) -> list[pb.Work]:
        """Work for the session's clients, waiting on the hub's condition (this
        thread) up to ``wait_s`` for some; a heartbeat returns nothing. See
        ``open_poll`` for ``call``."""
        p = self.open_poll(owner, session, wait_s, heartbeat, call)
        try:
            with self.cond:
                while (work := self.step_poll(p)) is None:
                    self.cond.wait(max(0.0, p.end - self.clock()))
                return work
        finally:
            self.end_poll(p, delivered=True)

    def open_poll(
        self,
        owner: str,
        session: str,
        wait_s: float,
        heartbeat: bool,
        call: CallContext | None = None,
    ) -> Poll:
        """A poll of ``owner``'s ``session`` begins (KeyError: no such session):
        every poll marks its clients alive. With ``call`` (the gRPC call) a call
        closed by the client's side marks the session gone at once."""
        with self.cond:
            ids = self.owned(owner, session)
            now = self.clock()
            if not self.presence.live(session, now):  # back after a spell away
                for c in ids:
                    self._lapsed(c, session, now)
            hold = 0.0 if self.presence.polling(session) else hold_seconds(call)
            token = self.presence.opened(session, heartbeat, now, held=heartbeat and hold > 0)
            for c in ids:
                self.spells.there(c, now)
            wait = hold if heartbeat else wait_s
            p = Poll(owner, session, heartbeat, token, now + max(0.0, min(wait, MAX_WAIT_S)))
            if call is not None and not call.add_callback(lambda: self._ended(session, token)):
                self._ended(session, token)  # already over
            return p

    def step_poll(self, p: Poll) -> list[pb.Work] | None:
        """The poll's answer now (the work handed out, maybe none), or None: it
        waits on (no work, the run goes on, its time is not up)."""
        with self.cond:
            if p.over or self.halted:
                return []
            ids = self.owned(p.owner, p.session)
            now = self.clock()
            for c in ids:
                self.members[c].last_seen = now
            gone = self.presence.is_hung_up(p.session)
            work = [] if p.heartbeat or gone else self.book.hand_out(ids, now, p.session)
            p.handed += [key_of(w) for w in work]
            self.message_bytes_down += sum(len(w.message) for w in work)
            if self.done and not work and not p.heartbeat:
                self._dismissed.add(p.session)
            if work or self.done or gone or now >= p.end:
                return work
            return None

    def end_poll(self, p: Poll, delivered: bool) -> None:
        """The poll's handler is done: ``delivered``, its reply goes out; else its
        call ended first, so the client's side closed it (the process is gone) and
        the work it handed out is pending again. Once per poll."""
        with self.cond:
            if p.closed:
                return
            p.closed = True
            if not delivered:
                p.over = True
                self._put_back(p)
                self._ended(p.session, p.token)
            self.presence.closed(p.session, p.token, self.clock())

    def unsent(self, p: Poll) -> None:
        """The reply to ``p`` was given but its call ended before it went out:
        the work it handed out is pending again."""
        with self.cond:
            p.over = True
            self._put_back(p)

    def _lapsed(self, cid: int, session: str, now: float) -> None:
        """``cid``'s session no longer counts as there: its open spell ends when
        the presence rules stopped counting it (``Presence.live_until``)."""
        if cid in self.spells.open:
            at = self.presence.live_until(session)
            self.spells.gone(cid, now if at is None else min(at, now))

    def _put_back(self, p: Poll) -> None:
        back = self.book.put_back(p.handed, p.session)
        p.handed = []
        self.message_bytes_down -= sum(len(self.book.asked[k].work.message) for k in back)
        if back:
            log_event("server", "work_put_back", clients=format_ids(sorted({k[0] for k in back})))
            self.on_wake()

    def _ended(self, session: str, token: int) -> None:
        """gRPC ended a poll of ``session`` (``token``): while its handler was
        still in it, the client's side closed it."""
        with self.cond:
            if self.presence.hung_up(session, token):
                ids = [c for c, m in self.members.items() if m.session == session]
                now = self.clock()
                for c in ids:
                    self.spells.gone(c, now)
                log_event("server", "client_gone", clients=format_ids(ids), why="connection closed")
                self.cond.notify_all()
                self.on_wake()
                self.on_change()


__all__ = ["MAX_WAIT_S", "Poll", "Polling"]

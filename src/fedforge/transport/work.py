"""The vocabulary of the deployment's work: the kinds of answer, the key of one
question to one client, a joined client, an answer taken, and a question asked
(``hub.py`` matches them)."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from fedforge.transport.pb import federation_pb2 as pb

# (client id, round, kind, phase): one question to one client
Key = tuple[int, int, str, str]

UPDATE, REPLY, EVALUATION = "update", "reply", "evaluation"
NOTICE = "notice"  # a COMMIT's acknowledgement: kept until acknowledged, nobody waits
SERVED = "served"  # a SERVE's acknowledgement (the serving model kept), likewise
ACKNOWLEDGEMENTS = (NOTICE, SERVED)
TRAINING_PAYLOAD = "round-"  # the prefix of the rounds' payload ids (remote.py)
SERVING = "serving-v"  # the prefix of the serving model's payload id (rollout.py)
# how the reply to an update the round did not judge within the hub's wait begins
UNJUDGED = "no verdict"


KINDS = {
    pb.Work.TRAIN: UPDATE,
    pb.Work.PHASE: REPLY,
    pb.Work.EVALUATE: EVALUATION,
    pb.Work.COMMIT: NOTICE,
    pb.Work.SERVE: SERVED,
}


@dataclass
class Member:
    """A client id the federation knows: who hosts it and what it declared."""

    client_id: int
    owner: str  # the authenticated name of the process that joined it
    num_examples: int  # the examples it trains on
    session: str
    last_seen: float  # time.monotonic() of its process's last poll or heartbeat
    # the examples it evaluates on (cold start, canary): its held-out ones, or
    # its training ones when it has none
    num_eval_examples: int


class Superseded(Exception):
    """A call waiting for a verdict gave its place to a repeat of its upload."""


class Verdict:
    """The round's word on an answer it was handed: None (taken) or why it was
    refused; the first word stands. An update's comes from the round's checks
    (``collect.py``), possibly only at the round's end; every other kind is
    taken as it comes. A thread waits for it with ``wait``, the gRPC event loop
    with ``awaited`` (no thread held)."""

    def __init__(self, client_id: int, round_idx: int) -> None:
        self.client_id, self.round_idx = client_id, round_idx
        self.future: Future[str | None] = Future()
        # the one call on the event loop waiting for the word (``awaited``), and
        # the word as the loop sees it (wrapped once: a wrapping stays on the
        # future until the word comes, so one for each repeat would pile up)
        self._waiter: asyncio.Future[None] | None = None
        self._on_loop: asyncio.Future[str | None] | None = None

    @classmethod
    def said(cls, client_id: int, round_idx: int, reason: str | None) -> Verdict:
        """A verdict given at once."""
        verdict = cls(client_id, round_idx)
        verdict.settle(reason)
        return verdict

    def settle(self, reason: str | None) -> None:
        with contextlib.suppress(InvalidStateError):  # a word was said already
            self.future.set_result(reason)

    @property
    def settled(self) -> bool:
        return self.future.done()

    def wait(self, timeout_s: float) -> str | None:
        """The word, or, when none came within ``timeout_s``, that none came."""
        try:
            return self.future.result(timeout_s)
        except TimeoutError:
            return self.unjudged(timeout_s)

    async def awaited(self, timeout_s: float) -> str | None:
        """``wait`` on an event loop, by one call at a time: a repeat of the upload
        (its sender's call was cut, or so it says) takes the place of the call that
        waits, which is told ``Superseded``; so repeats hold one waiting call, not
        one each. The shield keeps the word for the next wait."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        loop = asyncio.get_running_loop()
        mine: asyncio.Future[None] = loop.create_future()
        self._waiter = mine
        if self._on_loop is None or self._on_loop.get_loop() is not loop:
            self._on_loop = asyncio.wrap_future(self.future, loop=loop)
        word = asyncio.shield(self._on_loop)
        either: set[asyncio.Future[Any]] = {word, mine}
        try:
            await asyncio.wait(either, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            word.cancel()  # only the shield: the word itself stays
            if self._waiter is mine:
                self._waiter = None
        if self.future.done():
            return self.future.result()
        if mine.done():
            raise Superseded(
                f"a repeat of client {self.client_id}'s upload of round {self.round_idx + 1} "
                "waits for its verdict in this call's place"
            )
        return self.unjudged(timeout_s)

    def late(self, what: str) -> None:
        """The round was over before it judged the answer: ``what`` it did."""
        self.settle(f"client {self.client_id}'s update came after its round {what}")

    def unjudged(self, timeout_s: float) -> str:
        return (
            f"{UNJUDGED} on client {self.client_id}'s update of round {self.round_idx + 1} "
            f"within {timeout_s:g} s: the round had not judged it yet"
        )


@dataclass
class Answer:
    """A taken answer, waiting for the round thread."""

    client_id: int
    round_idx: int
    kind: str
    phase: str
    data: bytes
    seconds: float  # from the work's hand-out to its answer
    # an update's (download, training) seconds as its client says (None: unsaid;
    # untrusted: client_times.py bounds them by ``seconds``)
    reported: tuple[float, float] | None = None
    # what the round said of it: an update's is the round's checks' (its uploader
    # waits for it); any other kind is taken as it comes
    verdict: Verdict = field(init=False)

    def __post_init__(self) -> None:
        self.verdict = Verdict(self.client_id, self.round_idx)
        if self.kind != UPDATE:
            self.verdict.settle(None)

    @property
    def key(self) -> Key:
        return (self.client_id, self.round_idx, self.kind, self.phase)

    def late(self, what: str) -> None:
        """The round was over before it judged this answer: ``what`` it did."""
        self.verdict.late(what)


@dataclass
class Asked:
    """A question posted to one client: its work, the model version it names,
    when it was posted and handed out, and to which session."""

    work: pb.Work
    version: int
    posted: float
    handed: float | None = None
    session: str = ""  # the session it was handed to

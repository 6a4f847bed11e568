"""Which calls the deployment server lets in, and for how long it waits on them.

The server is asynchronous (``grpc.aio``): a call that has opened but whose
request has not arrived costs a coroutine, not a thread, so calls that never send
their request cannot starve the honest ones. What such calls could still cost is
bounded here:

- a request must arrive within ``request_wait_s`` of the call opening (an
  upload's signed header likewise, and each later part within ``silence_s``),
  else the call is cancelled;
- a peer address may hold at most ``pending_per_address`` calls whose request
  has not arrived yet, the server at most ``pending_calls`` such calls over all
  addresses (``deployment.pending_per_address``, ``deployment.pending_calls``);
  a call past either is answered RESOURCE_EXHAUSTED at once;
- an authenticated name may hold at most ``calls_per_name`` calls at work (a
  client process needs two: its poll and its heartbeat; a download is at work
  until its last chunk went, an upload until the hub has it: the wait for its
  verdict holds no place and no bytes, and one call of each upload waits);
- the uploads a name's calls are reading may declare ``upload_bytes_per_name``
  together (``deployment.max_message_mib``, the most one upload may declare), so
  one name cannot make the server hold a full-sized upload per place at work:
  an upload past it waits, its header read and its place at work held, until
  the name's uploads before it are in (and is refused after ``wait_s``); what
  its sender sends meanwhile stops at its stream's flow-control window;
- every refusal before the hub (these, and a sender unknown, revoked, unproven
  or replaying) is counted, and logged through ``refusal_log.py``: per peer
  address the first few in full, then a count per window, so a flood of calls
  cannot flood the log.

Connections are bounded where gRPC bounds them (``serve.py``): streams per
connection, the TLS handshake's time, and the size of one message before its
sender is known (``request_bytes``: 4 MiB, or the chunk size if larger, plus
64 KiB). A call waiting for its request holds at most that much (gRPC core
refuses a longer message from its length prefix), so what unauthenticated peers
can make the server hold is at most ``pending_calls * request_bytes``, one
address ``pending_per_address * request_bytes``. With the defaults (128 and 32
calls, 4 MiB + 64 KiB): 520 MiB in all, 130 MiB from one address; the uploads
of an authenticated name add at most ``deployment.max_message_mib`` on top
while they are read (and those waiting to be, a stream's window each).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import unquote

import grpc

from fedforge.transport.guard import Refused
from fedforge.transport.refusal_log import RefusalLog

T = TypeVar("T")

REQUEST_WAIT_S = 5.0  # from a call's opening to its (first) request
PENDING_PER_ADDRESS = 32  # calls of one peer address still waiting for their request
PENDING_CALLS = 128  # such calls of all addresses together
CALLS_PER_NAME = 16  # calls of one authenticated name at work at once
STREAMS_PER_CONNECTION = 64  # HTTP/2 streams one connection may hold open
HANDSHAKE_S = 10.0  # a TLS handshake must end within this
REQUEST_MIB = 4  # the largest message taken before its sender is known (plus a chunk)


def request_bytes(chunk_bytes: int) -> int:
    """The largest message the server reads (gRPC's limit): a request before its
    sender is known, or an upload's chunk, whichever is larger, and room for
    the message around it."""
    return max(REQUEST_MIB << 20, chunk_bytes) + (64 << 10)


def address(peer: str) -> str:
    """The address of a gRPC peer string, without its port ("ipv4:1.2.3.4:567"),
    unescaped ("ipv6:%5B::1%5D:567": "ipv6:[::1]")."""
    host, sep, port = peer.rpartition(":")
    return unquote(host if sep and port.isdigit() else peer)


@dataclass
class Admission:
    """Counts of the calls in flight, by peer address and by authenticated name;
    ``count`` counts each refusal (by its reason), ``log`` says them."""

    count: Callable[[str], None]
    log: RefusalLog
    request_wait_s: float = REQUEST_WAIT_S
    silence_s: float = 30.0  # between an upload's parts
    pending_per_address: int = PENDING_PER_ADDRESS
    pending_calls: int = PENDING_CALLS
    calls_per_name: int = CALLS_PER_NAME
    upload_bytes_per_name: int = 256 << 20
    cut: int = 0  # calls cancelled because their request (or next part) did not come
    pending: dict[str, int] = field(default_factory=dict)
    waiting_calls: int = 0  # the sum of ``pending``
    active: dict[str, int] = field(default_factory=dict)
    reading: dict[str, int] = field(default_factory=dict)  # declared bytes, by name
    room: dict[str, asyncio.Event] = field(default_factory=dict)  # set when some is freed

    # every method runs on the server's event loop: no lock is needed

    @contextmanager
    def waiting(self, peer: str) -> Iterator[None]:
        """A call of ``peer`` until its request arrived (Refused: too many)."""
        where = address(peer)
        if self.pending.get(where, 0) >= self.pending_per_address:
            raise self.refuse(
                where,
                where,
                f"{where} has {self.pending_per_address} calls waiting for their request "
                "already; try again later",
            )
        if self.waiting_calls >= self.pending_calls:
            raise self.refuse(
                where,
                where,
                f"the server has {self.pending_calls} calls waiting for their request "
                "already; try again later",
            )
        self.pending[where] = self.pending.get(where, 0) + 1
        self.waiting_calls += 1
        try:
            yield
        finally:
            self.waiting_calls -= 1
            self.pending[where] -= 1
            if not self.pending[where]:
                del self.pending[where]

    @contextmanager
    def working(self, who: str) -> Iterator[None]:
        """A call of the authenticated ``who`` at work (Refused: too many; logged
        by its name)."""
        if self.active.get(who, 0) >= self.calls_per_name:
            raise self.refuse(
                who,
                who,
                f"'{who}' has {self.calls_per_name} calls at work already; try again later",
            )
        self.active[who] = self.active.get(who, 0) + 1
        try:
            yield
        finally:
            self.active[who] -= 1
            if not self.active[who]:
                del self.active[who]

    @asynccontextmanager
    async def reading_upload(self, who: str, size: int, wait_s: float) -> AsyncIterator[bool]:
        """An upload of the authenticated ``who``, declared ``size`` bytes, while its
        body is read: it first waits until the name's uploads being read leave
        room for it (Refused: none within ``wait_s``, or ``size`` is more than
        ``upload_bytes_per_name`` alone). Yields whether it waited."""
        if size > self.upload_bytes_per_name:  # never room: not waited for (the server
            raise self.refuse(  # refuses such an upload first, against the same bound)
                who,
                who,
                f"upload of {size} bytes: at most {self.upload_bytes_per_name} are taken",
            )
        loop = asyncio.get_running_loop()
        end = loop.time() + wait_s
        waited = False
        while (held := self.reading.get(who, 0)) + size > self.upload_bytes_per_name:
            waited = True
            left = end - loop.time()
            if left <= 0:
                raise self.refuse(
                    who,
                    who,
                    f"'{who}' is sending uploads of {held} bytes; with this one's {size} "
                    f"they would pass the {self.upload_bytes_per_name} bytes a name may "
                    f"send at once (deployment.max_message_mib), and no room came in "
                    f"{wait_s:g} s",
                )
            room = self.room.setdefault(who, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(room.wait(), left)
        self.reading[who] = held + size
        try:
            yield waited
        finally:
            self.reading[who] -= size
            if not self.reading[who]:
                del self.reading[who]
            freed = self.room.pop(who, None)  # the name's waiting uploads look again
            if freed is not None:
                freed.set()

    async def first(self, parts: AsyncIterator[T], peer: str, what: str) -> T:
        """The call's first message, within ``request_wait_s`` (Refused: none came)."""
        with self.waiting(peer):
            got = await self.next(parts, self.request_wait_s, peer, what)
        if got is None:
            raise self.refuse(
                address(peer),
                address(peer),
                f"a call ended without its {what}",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        return got

    async def next(self, parts: AsyncIterator[T], wait_s: float, peer: str, what: str) -> T | None:
        """The next message of ``parts`` within ``wait_s`` (None: the stream ended;
        Refused: nothing came in time)."""
        try:
            return await asyncio.wait_for(anext(parts), wait_s)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            self.cut += 1
            raise self.refuse(
                address(peer),
                address(peer),
                f"no {what} within {wait_s:g} s (cancelled)",
                grpc.StatusCode.CANCELLED,
            ) from None

    def refuse(
        self,
        where: str,
        who: str,
        reason: str,
        code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED,
    ) -> Refused:
        """The refusal of a call from ``where`` (a peer address, or the name of
        an authenticated caller), counted and logged."""
        self.refused(where, who, reason)
        return Refused(code, reason, who, said=True)

    def refused(self, where: str, who: str, reason: str) -> None:
        """Count a refused call from ``where`` and log it (at a bounded rate per
        ``where``)."""
        self.count(reason)
        self.log.refused(who, where, reason)

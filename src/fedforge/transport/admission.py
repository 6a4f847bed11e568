"""Which calls the deployment server lets in, and for how long it waits on them.

The server is asynchronous (``grpc.aio``): a call that has opened but whose
request has not arrived costs a coroutine, not a thread, so calls that never send
their request cannot starve the honest ones. What such calls could still cost is
bounded here:

- a request must arrive within ``request_wait_s`` of the call opening (an
  upload's signed header likewise, and each later part within ``silence_s``),
  else the call is cancelled;
- a peer address may hold at most ``pending_per_address`` calls whose request
  has not arrived yet, and an authenticated name at most ``calls_per_name``
  calls at work (a client process needs two: its poll and its heartbeat);
- refusals of this kind are logged at most once a second per kind, with the
  number since the last line, so a flood of calls cannot flood the log.

Connections are bounded where gRPC bounds them (``serve.py``): streams per
connection, the TLS handshake's time, and the size of one message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from fedforge.transport.guard import Refused

T = TypeVar("T")

REQUEST_WAIT_S = 5.0  # from a call's opening to its (first) request
PENDING_PER_ADDRESS = 512  # calls of one peer address still waiting for their request
CALLS_PER_NAME = 16  # calls of one authenticated name at work at once
STREAMS_PER_CONNECTION = 64  # HTTP/2 streams one connection may hold open
HANDSHAKE_S = 10.0  # a TLS handshake must end within this
REQUEST_MIB = 4  # the largest message taken before its sender is known (plus a chunk)


def address(peer: str) -> str:
    """The address of a gRPC peer string, without its port ("ipv4:1.2.3.4:567")."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer


@dataclass
class Admission:
    """Counts of the calls in flight, by peer address and by authenticated name."""

    on_refusal: Callable[[str, int | None, str], None]
    request_wait_s: float = REQUEST_WAIT_S
    silence_s: float = 30.0  # between an upload's parts
    pending_per_address: int = PENDING_PER_ADDRESS
    calls_per_name: int = CALLS_PER_NAME
    cut: int = 0  # calls cancelled because their request (or next part) did not come
    pending: dict[str, int] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)
    _said: dict[str, tuple[float, int]] = field(default_factory=dict)

    # every method runs on the server's event loop: no lock is needed

    @contextmanager
    def waiting(self, peer: str) -> Iterator[None]:
        """A call of ``peer`` until its request arrived (Refused: too many)."""
        where = address(peer)
        if self.pending.get(where, 0) >= self.pending_per_address:
            raise self._refuse(
                "busy",
                where,
                f"{where} has {self.pending_per_address} calls waiting for their request "
                "already; try again later",
            )
        self.pending[where] = self.pending.get(where, 0) + 1
        try:
            yield
        finally:
            self.pending[where] -= 1
            if not self.pending[where]:
                del self.pending[where]

    @contextmanager
    def working(self, who: str) -> Iterator[None]:
        """A call of the authenticated ``who`` at work (Refused: too many)."""
        if self.active.get(who, 0) >= self.calls_per_name:
            raise self._refuse(
                "busy",
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

    async def first(self, parts: AsyncIterator[T], peer: str, what: str) -> T:
        """The call's first message, within ``request_wait_s`` (Refused: none came)."""
        with self.waiting(peer):
            got = await self.next(parts, self.request_wait_s, peer, what)
        if got is None:
            raise self._refuse(
                "empty",
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
            raise self._refuse(
                "silent",
                address(peer),
                f"no {what} within {wait_s:g} s (cancelled)",
                grpc.StatusCode.CANCELLED,
            ) from None

    def _refuse(
        self,
        kind: str,
        who: str,
        reason: str,
        code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED,
    ) -> Refused:
        """The refusal, said (counted and logged) at most once a second per kind."""
        now = time.monotonic()
        last, unsaid = self._said.get(kind, (-1e9, 0))
        if now - last >= 1.0:
            more = f" ({unsaid} more like it in the last {now - last:.0f} s)" if unsaid else ""
            self.on_refusal(who, None, reason + more)
            self._said[kind] = (now, 0)
        else:
            self._said[kind] = (last, unsaid + 1)
        return Refused(code, reason, who, said=True)

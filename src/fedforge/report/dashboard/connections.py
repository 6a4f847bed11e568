"""What a connection to the dashboard may hold before it is a request.

uvicorn closes an idle keep-alive connection once a response went out, but a
connection that never finishes its request line and headers (sent slowly, or not
at all) stays open, before any token is checked: enough of them exhaust the
process's file descriptors and nobody reaches the dashboard. Here each
connection must complete a request's headers within ``HEADERS_S`` of opening
and of each response, and one peer address may hold ``PER_ADDRESS`` connections
at once (past that a new one is closed at once). A TLS handshake is bounded by
asyncio (60 s) before the connection reaches this protocol.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADERS_S = 10.0  # from a connection's opening, or a response's end, to a request's headers
PER_ADDRESS = 64  # connections one peer address may hold open at once


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with the bounds of the module; a server's own
    subclass (``bounded_protocol``) holds its count of connections per address."""

    headers_s = HEADERS_S
    per_address = PER_ADDRESS
    open_per_address: Counter[str] = Counter()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._address: str | None = None  # counted while open
        address = self.client[0] if self.client else ""
        if self.open_per_address[address] >= self.per_address:
            transport.close()  # closed before it held anything
            return
        self.open_per_address[address] += 1
        self._address = address
        self._arm(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self._address is not None:
            self.open_per_address[self._address] -= 1
            if self.open_per_address[self._address] <= 0:
                del self.open_per_address[self._address]
            self._address = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        done = self.cycle  # armed first: a pipelined request may start in super()'s
        self._arm(done)
        super().on_response_complete()

    def _arm(self, waiting_for: Any) -> None:
        """The next request's headers are due within ``headers_s``: a request
        other than ``waiting_for`` (the one just served, or none) must start."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.headers_s, self._due, waiting_for)

    def _due(self, waiting_for: Any) -> None:
        self._deadline = None
        if self.cycle is waiting_for and not self.transport.is_closing():
            self.transport.close()  # no request's headers came in time


def bounded_protocol(headers_s: float = HEADERS_S, per_address: int = PER_ADDRESS) -> type:
    """A protocol class for one server, with its own count of connections."""
    fields = {"headers_s": headers_s, "per_address": per_address, "open_per_address": Counter()}
    return type("ServerBoundedH11", (BoundedH11,), fields)


__all__ = ["HEADERS_S", "PER_ADDRESS", "BoundedH11", "bounded_protocol"]

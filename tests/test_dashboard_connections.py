"""The dashboard's connections (report/dashboard/connections.py), on a real
uvicorn server in this process with the bounds shortened: a connection that
sends no request, or half of one, is closed once its headers are due; a
request, a second one on the same connection, and a response longer than the
deadline are served; one address holds a bounded number of connections."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from fedforge.report.dashboard.connections import bounded_protocol

HEADERS_S = 2.0  # slack for a loaded machine: the default is 10 s
PER_ADDRESS = 3


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def slow(request: Request) -> StreamingResponse:
    async def parts() -> AsyncIterator[bytes]:
        for _ in range(12):  # 3 s in all: longer than the deadline
            yield b"tick\n"
            await asyncio.sleep(0.25)

    return StreamingResponse(parts())


@contextmanager
def serving(app: Any = None) -> Iterator[int]:
    """The server of ``app`` (by default one saying hello, slowly at /slow) on a
    loopback port, in a thread: its port."""
    app = app or Starlette(routes=[Route("/", hello), Route("/slow", slow)])
    config = uvicorn.Config(
        app, log_level="warning", http=bounded_protocol(HEADERS_S, PER_ADDRESS), ws="none"
    )
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    end = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < end, "the server did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def closed_after(s: socket.socket, t0: float, most_s: float = 5) -> float:
    """Seconds from ``t0`` until the server closed ``s`` (its reads end; at most
    ``most_s`` of waiting)."""
    s.settimeout(most_s)
    while s.recv(4096):  # a response to a request cut short, then the end
        pass
    return time.monotonic() - t0


def get(s: socket.socket, path: str = "/") -> bytes:
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    got = b""
    while b"\r\n0\r\n\r\n" not in got and not got.endswith(b"hello"):
        part = s.recv(4096)
        assert part, got
        got += part
    return got


def test_a_request_never_finished_is_closed_when_its_headers_are_due() -> None:
    with serving() as port:
        t0 = time.monotonic()
        silent, half = connect(port), connect(port)
        half.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for s in (silent, half):
            assert HEADERS_S * 0.9 < closed_after(s, t0) < HEADERS_S + 2
            s.close()


def test_requests_in_time_and_a_long_response_are_served() -> None:
    with serving() as port:
        s = connect(port)
        assert get(s).endswith(b"hello")
        time.sleep(HEADERS_S / 2)
        assert get(s).endswith(b"hello")  # the same connection, a new deadline
        assert get(s, "/slow").count(b"tick") == 12  # longer than the deadline
        s.close()


def test_one_address_holds_a_bounded_number_of_connections() -> None:
    with serving() as port:
        held = [connect(port) for _ in range(PER_ADDRESS)]
        time.sleep(0.1)
        t0 = time.monotonic()
        extra = connect(port)
        assert closed_after(extra, t0) < HEADERS_S / 2  # at once, not at the deadline
        extra.close()
        for s in held:
            s.close()
        time.sleep(0.1)
        s = connect(port)
        assert get(s).endswith(b"hello")  # their places are free again
        s.close()

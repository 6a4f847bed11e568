"""Whether a server's address is free on every interface it names, before gRPC
binds it.

gRPC binds each address a host name resolves to (``localhost``: 127.0.0.1 and
::1) and listens as long as one of them binds, so a second server started on
the port of a running one would listen on the other family alone, and clients
resolving the name would reach either. The server checks first: each resolved
address is bound by a plain socket (SO_REUSEADDR, as gRPC's own, so a socket of
a stopped server in TIME_WAIT does not block it) and released. Runs on the
server host, before it listens.
"""

from __future__ import annotations

import errno
import socket
from typing import Any


def taken(host: str, port: int) -> list[str]:
    """The addresses ``host:port`` resolves to where something listens already
    (none for port 0, or a host that does not resolve: gRPC says so itself)."""
    if port == 0:
        return []
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    # gRPC binds both loopbacks for "localhost", whatever /etc/hosts lists
    names = ["127.0.0.1", "::1"] if name == "localhost" else [name]
    infos: list[tuple[Any, ...]] = []
    for one in names:
        try:
            infos += socket.getaddrinfo(one, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror:
            continue
    return [f"{info[4][0]}:{info[4][1]}" for info in infos if _in_use(info)]


def _in_use(info: tuple[Any, ...]) -> bool:
    """Whether binding ``where`` fails for a listener there (an address this host
    lacks, IPv6 switched off, is not "in use": gRPC skips or reports it)."""
    family, kind, proto, _, where = info
    try:
        s = socket.socket(family, kind, proto)
    except OSError:
        return False
    with s:
        # as gRPC binds: SO_REUSEADDR, and "::" dual-stack (the system's default)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(where)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False

"""Who may read the dashboard: anyone on this machine when it listens on a
loopback address; with an access token, only those who present it. And under
which names: only those it was told of.

A dashboard bound to any other address refuses to start without a token
(``--token`` or ``FEDFORGE_DASHBOARD_TOKEN``). With a token, every request must
carry it: ``Authorization: Bearer TOKEN``, or the cookie set when a page was
opened once with ``?token=TOKEN`` (that request is redirected to the same path
without the token, so it does not stay in the address bar); anything else gets
401. The cookie's name holds the port (``fedforge_dashboard_8765``): browsers
share cookies between the ports of one host, and two dashboards there must not
overwrite each other's. Tokens are compared in constant time
(``hmac.compare_digest``). Websocket connections are refused (none is served).

Every request's ``Host`` must name this dashboard (:class:`HostGate`):
127.0.0.1, localhost, [::1], the ``--host`` address or an ``--allow-host`` name,
with any port; else 400. A web page elsewhere cannot then read a token-less
loopback dashboard by pointing a name of its own at 127.0.0.1 (DNS rebinding).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from fedforge.core.errors import ConfigError

TOKEN_ENV = "FEDFORGE_DASHBOARD_TOKEN"
COOKIE = "fedforge_dashboard"  # the prefix: cookie_name() adds the port
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
MIN_TOKEN_CHARS = 16
# what a cookie and a header carry unquoted: secrets.token_urlsafe's and base64's
_TOKEN = re.compile(rf"[A-Za-z0-9._~+/=-]{{{MIN_TOKEN_CHARS},}}")
# where a ``?token=`` visit may be sent back to: a path of printable ASCII on this
# origin; "//x" and "/\\x" would leave it (browsers read both as another host)
_LOCAL_PATH = re.compile(r"/(?![/\\])[!-~]*")
# a Host header: a name or an IPv4 address, or an IPv6 one in brackets; a port
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::\d{1,5})?")

Scope = dict[str, Any]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: whatever it resolves to


def access_token(host: str, given: str | None) -> str | None:
    """The token every request must carry (None: none needed): ``given``, else
    ``$FEDFORGE_DASHBOARD_TOKEN``. ConfigError for a non-loopback ``host`` without
    one, and for a token too short to guess slowly."""
    token = given if given is not None else os.environ.get(TOKEN_ENV) or None
    if token is None:
        if not is_loopback(host):
            raise ConfigError(
                f"--host {host} is not a loopback address: the dashboard needs an access "
                f"token there (--token TOKEN or {TOKEN_ENV}); or listen on 127.0.0.1"
            )
        return None
    if not _TOKEN.fullmatch(token):
        raise ConfigError(
            f"the dashboard's access token is invalid: it must be at least {MIN_TOKEN_CHARS} "
            "characters of A-Z a-z 0-9 . _ ~ + / = - (e.g. from: python -c "
            "'import secrets; print(secrets.token_urlsafe())')"
        )
    return token


def host_name(value: str) -> str | None:
    """The name in a ``Host`` header (lowercase; an IPv6 address without its
    brackets), its port dropped; None for a value that is no host[:port]."""
    found = _HOST.fullmatch(value)
    return (found["v6"] or found["name"]).lower() if found else None


def admitted_name(value: str) -> str | None:
    """The name a ``--host`` or ``--allow-host`` value admits (as :func:`host_name`
    reads it; a bare IPv6 address too); None for a value that is no host."""
    return host_name(value) or (host_name(f"[{value}]") if ":" in value else None)


class HostGate:
    """ASGI middleware: serves only requests whose ``Host`` names one of
    ``names`` (any port), else 400 saying which names it answers to."""

    def __init__(self, app: Any, names: tuple[str, ...]) -> None:
        self.app = app
        self.names = tuple(dict.fromkeys(n for n in map(admitted_name, names) if n))

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan; TokenGate refuses websockets
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if host_name(given) in self.names:
            await self.app(scope, receive, send)
            return
        known = ", ".join(f"[{n}]" if ":" in n else n for n in self.names)
        body = (
            f"400 Bad Request: Host {given!r} is not a name of this dashboard "
            f"(it answers to {known}; add one with --allow-host NAME)\n"
        )
        await _respond(send, 400, body.encode(), [(b"content-type", b"text/plain; charset=utf-8")])


def cookie_name(scope: Scope) -> str:
    """The token's cookie for the port this request came to."""
    server = scope.get("server")
    return f"{COOKIE}_{server[1]}" if server and server[1] is not None else COOKIE


def back_to(scope: Scope, query: list[tuple[str, str]]) -> str:
    """Where a ``?token=`` visit is redirected: the path as the request spelled it
    (``raw_path``, still percent-encoded) when it is one of this origin, else
    ``/``, with the rest of the query."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(scope["path"])
    where = path if _LOCAL_PATH.fullmatch(path) else "/"
    rest = urlencode([(k, v) for k, v in query if k != "token"])
    return where + (f"?{rest}" if rest else "")


class TokenGate:
    """ASGI middleware: lets a request through only with the token."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._token = token.encode()

    def _ok(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self._token)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket: no route takes one, and no token seen
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        auth = headers.get("authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("cookie", ""))
        except CookieError:  # a garbled Cookie header: as if none came
            cookie = SimpleCookie()
        name = cookie_name(scope)
        jar = cookie[name].value if name in cookie else None
        if self._ok(bearer) or self._ok(jar):
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if self._ok(given):
            kept = f"{name}={self._token.decode()}; Path=/; HttpOnly; SameSite=Strict".encode()
            where = back_to(scope, query).encode("latin-1")
            await _respond(send, 303, b"", [(b"location", where), (b"set-cookie", kept)])
            return
        body = b"401 Unauthorized: this dashboard needs its access token\n"
        await _respond(
            send, 401, body, [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]
        )


async def _respond(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "COOKIE",
    "LOOPBACK_NAMES",
    "TOKEN_ENV",
    "HostGate",
    "TokenGate",
    "access_token",
    "admitted_name",
    "back_to",
    "cookie_name",
    "host_name",
    "is_loopback",
]

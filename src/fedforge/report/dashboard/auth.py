"""Who may read the dashboard: anyone on this machine when it listens on a
loopback address; with an access token, only those who present it.

A dashboard bound to any other address refuses to start without a token
(``--token`` or ``FEDFORGE_DASHBOARD_TOKEN``). With a token, every request must
carry it: ``Authorization: Bearer TOKEN``, or the cookie set when a page was
opened once with ``?token=TOKEN`` (that request is redirected to the same
address without the token, so it does not stay in the address bar); anything
else gets 401. Tokens are compared in constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fedforge.core.errors import ConfigError

TOKEN_ENV = "FEDFORGE_DASHBOARD_TOKEN"
COOKIE = "fedforge_dashboard"
MIN_TOKEN_CHARS = 16
# what a cookie and a header carry unquoted: secrets.token_urlsafe's and base64's
_TOKEN = re.compile(rf"[A-Za-z0-9._~+/=-]{{{MIN_TOKEN_CHARS},}}")

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


class TokenGate:
    """ASGI middleware: lets a request through only with the token."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._token = token.encode()

    def _ok(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self._token)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        auth = headers.get("authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("cookie", ""))
        except CookieError:  # a garbled Cookie header: as if none came
            cookie = SimpleCookie()
        jar = cookie[COOKIE].value if COOKIE in cookie else None
        if self._ok(bearer) or self._ok(jar):
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if self._ok(given):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            where = scope.get("root_path", "") + scope["path"] + (f"?{rest}" if rest else "")
            await _respond(
                send,
                303,
                b"",
                [
                    (b"location", where.encode("latin-1")),
                    (
                        b"set-cookie",
                        f"{COOKIE}={self._token.decode()}; Path=/; HttpOnly; "
                        "SameSite=Strict".encode(),
                    ),
                ],
            )
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


__all__ = ["COOKIE", "TOKEN_ENV", "TokenGate", "access_token", "is_loopback"]

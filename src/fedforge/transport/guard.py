"""Who is calling: the deployment server's authentication of each request.

Three modes. ``mtls`` (mutual TLS): the client's certificate, checked against the
federation's CA during the handshake, names it (its common name). ``keys``: each
request carries an Ed25519 signature over (method, client, nonce, timestamp,
SHA-256 of the body) by a key registered in the server's keys file; stale
timestamps and replayed nonces are refused (``auth.py``). ``insecure``: the
client's own claim, believed (only with ``--insecure``, said loudly). In every
mode a name listed in the revocation file is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from fedforge.transport.files import MAX_NAME_CHARS
from fedforge.transport.pb import federation_pb2 as pb

MODES = ("mtls", "keys", "insecure")


class Refused(Exception):
    """A request refused before it reaches the hub: its status code and reason;
    ``said``: already counted and logged (``admission.py``, at a bounded rate per
    address: ``refusal_log.py``)."""

    def __init__(
        self, code: grpc.StatusCode, reason: str, who: str | None = None, said: bool = False
    ) -> None:
        super().__init__(reason)
        self.code, self.reason, self.who, self.said = code, reason, who, said


@dataclass
class Guard:
    """Authenticates requests in one of MODES; ``verifier``: the keys mode's."""

    mode: str
    verifier: object | None = None  # auth.Verifier under keys
    revoked: frozenset[str] = frozenset()

    def who(self, method: str, signed: pb.Signed, context: grpc.ServicerContext) -> str:
        """The authenticated name of the caller (Refused: none)."""
        if self.mode == "mtls":
            names = context.auth_context().get("x509_common_name") or []
            if not names:
                raise Refused(grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
            name = names[0].decode()
        elif self.mode == "keys":
            name = self._verified(method, signed)
        else:
            name = signed.auth.client or context.peer()
            if len(name) > MAX_NAME_CHARS:
                why = f"client name of {len(name)} characters: at most {MAX_NAME_CHARS}"
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, why)
        if name in self.revoked:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"client '{name}' is revoked", name)
        return name

    def _verified(self, method: str, signed: pb.Signed) -> str:
        from fedforge.transport.auth import AuthError, Envelope

        a = signed.auth
        env = Envelope(a.client, a.nonce, a.timestamp, a.signature)
        try:
            self.verifier.verify(method, signed.body, env)  # type: ignore[attr-defined]
        except AuthError as exc:  # retry: UNAVAILABLE, which a client meets by signing again
            code = grpc.StatusCode.UNAVAILABLE if exc.retry else grpc.StatusCode.UNAUTHENTICATED
            raise Refused(code, str(exc), a.client or None) from None
        return a.client

"""TLS for both ends, from a federation folder made by ``fedforge certs``:
``ca.pem``, ``server.pem``/``server.key``, ``clients/<name>.pem``/``.key``, and
optionally ``keys.json`` (registered Ed25519 keys), ``revoked.txt`` and
``members.json`` (which client ids each name may host: ``members.py``). The
server refuses to start without ``members.json`` unless told ``any_member``
(``--any-member``, said with a warning): then the first name to join an id
holds it.

TLS is the default; plaintext only with an explicit ``insecure`` (and a warning
on both sides). ``mtls``: the server asks every client for a certificate signed
by the federation's CA. ``keys``: server-only TLS, and each request signed by a
key the server has registered.

Revocation under ``mtls`` happens in the TLS handshake. grpcio's Python API has
no certificate revocation list (gRPC core checks CRLs only for its ``TlsCredentials``,
which Python does not expose), but gRPC's TLS takes any certificate among its
trust roots as trusted in itself. So while ``revoked.txt`` names anyone, the
server trusts not the CA but each client certificate in ``clients/`` that the CA
signed and whose name is not revoked: a revoked certificate fails the handshake,
and so does one that is not in the server's ``clients/`` folder (said at start).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import grpc

from fedforge.core.errors import ConfigError
from fedforge.transport.guard import MODES, Guard
from fedforge.transport.members import MEMBERS_FILE, Binding, load_members

INSECURE_WARNING = (
    "fedforge: WARNING: --insecure: plaintext gRPC, clients not authenticated; "
    "anyone on the network can read the model and send updates"
)
ANY_MEMBER_WARNING = (
    "fedforge: WARNING: --any-member: no members.json; any authenticated client may "
    "claim any client id that nobody holds yet"
)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} '{path}': {exc.strerror}") from None


def client_roots(folder: Path, revoked: frozenset[str]) -> tuple[bytes, int]:
    """The trust roots for client certificates: the CA, or, with anyone revoked,
    the CA-signed certificates in ``clients/`` of the names not revoked; and how
    many certificates that is (0: the CA)."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    from fedforge.transport.certs import CertError, peer_name

    ca_pem = _read(folder / "ca.pem", "CA certificate")
    if not revoked:
        return ca_pem, 0
    ca = x509.load_pem_x509_certificate(ca_pem)
    kept = []
    for path in sorted((folder / "clients").glob("*.pem")):
        pem = _read(path, "client certificate")
        try:
            x509.load_pem_x509_certificate(pem).verify_directly_issued_by(ca)
            if peer_name(pem) not in revoked:
                kept.append(pem)
        except (ValueError, TypeError, InvalidSignature, CertError):
            continue  # not one of this federation's client certificates
    if not kept:  # everyone revoked: the CA, and the guard refuses each call
        return ca_pem, 0
    return b"".join(kept), len(kept)


def _revoked(folder: Path) -> frozenset[str]:
    """The folder's revocation list (none: nobody is revoked)."""
    from fedforge.transport.certs import load_revoked

    path = folder / "revoked.txt"
    return load_revoked(path) if path.is_file() else frozenset()


@dataclass(frozen=True)
class ServerSecurity:
    """The server's credentials and request guard."""

    mode: str  # one of guard.MODES
    certs: Path | None = None  # the federation folder (mtls, keys)
    any_member: bool = False  # without members.json: the first to join an id holds it

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"auth mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.mode != "insecure" and self.certs is None:
            raise ConfigError(
                f"auth mode {self.mode!r} needs --certs DIR (made by `fedforge certs`), "
                "or --insecure for plaintext"
            )

    def credentials(self) -> grpc.ServerCredentials | None:
        if self.mode == "insecure":
            print(INSECURE_WARNING, file=sys.stderr, flush=True)
            return None
        assert self.certs is not None
        pair = (_read(self.certs / "server.key", "key"), _read(self.certs / "server.pem", "cert"))
        if self.mode != "mtls":
            return grpc.ssl_server_credentials([pair])
        roots, pinned = client_roots(self.certs, _revoked(self.certs))
        if pinned:
            print(
                f"fedforge: mtls with revocations: the server trusts the {pinned} client "
                f"certificates in {self.certs / 'clients'} that are not revoked (a client "
                "certificate not there fails the TLS handshake)",
                file=sys.stderr,
                flush=True,
            )
        return grpc.ssl_server_credentials(
            [pair], root_certificates=roots, require_client_auth=True
        )

    def members(self) -> Binding | None:
        """``members.json``: each name's client ids (None: anyone may claim any id,
        under ``insecure`` or ``any_member``); ConfigError without it otherwise."""
        if self.mode == "insecure" or self.certs is None:
            return None
        path = self.certs / MEMBERS_FILE
        if self.any_member:
            if path.exists():
                raise ConfigError(
                    f"--any-member with '{path}': the file binds each name to its ids; "
                    "remove the file or drop --any-member"
                )
            print(ANY_MEMBER_WARNING, file=sys.stderr, flush=True)
            return None
        if not path.exists():
            raise ConfigError(
                f"'{path}' does not exist: without it any client of the federation may claim "
                f"any client id; bind each name to its ids (`fedforge certs --out {self.certs} "
                "--members client-0=0-24,client-1=25-49`), or pass --any-member"
            )
        return load_members(path)

    def guard(self) -> Guard:
        """The guard, with the revocation list as it is now (read at each start)."""
        revoked = _revoked(self.certs) if self.certs is not None else frozenset()
        verifier = None
        if self.mode == "keys":
            assert self.certs is not None
            from fedforge.transport.auth import Verifier, load_keys

            verifier = Verifier(load_keys(self.certs / "keys.json"), revoked)
        return Guard(self.mode, verifier, revoked)


@dataclass(frozen=True)
class ClientSecurity:
    """A client process's channel and request signer."""

    mode: str
    name: str  # the process's name: its certificate's common name, or its key's
    certs: Path | None = None  # the federation folder (its ca.pem, clients/<name>.*)
    key: Path | None = None  # keys mode: the Ed25519 private key

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"auth mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.mode != "insecure" and self.certs is None:
            raise ConfigError(f"auth mode {self.mode!r} needs --certs DIR, or --insecure")
        if self.mode == "keys" and self.key is None:
            raise ConfigError("auth mode 'keys' needs --key FILE (made by `fedforge keys`)")

    def channel(self, target: str, max_bytes: int) -> grpc.Channel:
        options = [
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes),
        ]
        if self.mode == "insecure":
            print(INSECURE_WARNING, file=sys.stderr, flush=True)
            return grpc.insecure_channel(target, options=options)
        assert self.certs is not None
        ca = _read(self.certs / "ca.pem", "CA certificate")
        if self.mode == "mtls":
            mine = self.certs / "clients" / self.name
            creds = grpc.ssl_channel_credentials(
                ca, _read(mine.with_suffix(".key"), "key"), _read(mine.with_suffix(".pem"), "cert")
            )
        else:
            creds = grpc.ssl_channel_credentials(ca)
        return grpc.secure_channel(target, creds, options=options)

    def signer(self) -> object | None:
        if self.mode != "keys":
            return None
        from fedforge.transport.auth import Signer, load_identity

        assert self.key is not None
        return Signer(self.name, load_identity(self.key))

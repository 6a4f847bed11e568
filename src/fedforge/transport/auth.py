"""Request authentication: each client signs its requests with a registered Ed25519 key.

A client holds an Ed25519 private key (its *identity*, :func:`generate_identity`);
the server holds every client's public key in ``keys.json`` (:func:`load_keys`), a
JSON object mapping client name to the base64 of the 32-byte raw public key. For
each request the client's :class:`Signer` makes an :class:`Envelope` and the
server's :class:`Verifier` checks it before it acts on the request.

On the wire (``federation.proto``) a request is a ``Signed`` message: ``body`` is
the serialized request message (``HelloRequest``, ``JoinRequest``, ``PollRequest``,
``DownloadRequest``; for ``Upload``, the ``UploadHeader`` in the stream's first
part, whose SHA-256 field covers the data parts that follow) and ``auth`` holds
the client name, nonce, timestamp and signature. What is signed
(:func:`signed_bytes`) is the concatenation of six fields, each written as its
length (4 bytes, big-endian) followed by its bytes:

1. the domain tag ``b"fedforge-request-v1"`` (a signature made here means nothing
   in another protocol, nor in a later version of this one),
2. the RPC method's bare name, UTF-8: one of ``Hello``, ``Join``, ``Poll``,
   ``Download``, ``Upload`` (not the gRPC path ``/fedforge.v1.Federation/Upload``),
3. the client name, UTF-8 (1 to 64 characters: ``files.NAME_RULE``),
4. the nonce: 16 random bytes,
5. the timestamp: seconds since the Unix epoch as an IEEE-754 double, big-endian
   (the same double as ``Auth.timestamp``),
6. the SHA-256 digest of ``body`` (32 bytes).

The signature is Ed25519's 64 bytes over those bytes. Length prefixes make the
encoding unambiguous: no two different tuples of fields give the same bytes.

The server accepts a timestamp within ``max_skew_s`` of its own clock and not
before the server started (``not_before``), and remembers each nonce until its
timestamp leaves that window, so a copied request is refused whether it is
replayed early (nonce seen), late (stale) or to a restarted server, which
remembers no nonce from before its start (signed before it). The last refusal
(:class:`AuthError` with ``retry`` set) asks an honest client to sign again: a
client whose clock is behind the server's meets it for that lag after a restart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
import math
import os
import struct
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedforge.core.errors import ConfigError, FedforgeError, shown
from fedforge.transport.files import MAX_NAME_CHARS, check_name, read_bytes, write_atomic

DOMAIN = b"fedforge-request-v1"
NONCE_BYTES = 16
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
MAX_NONCES_PER_CLIENT = 100_000


class AuthError(FedforgeError):
    """A request's envelope is refused; ``reason`` (also the message) says why;
    ``retry``: an honest client signing it again now would be accepted."""

    def __init__(self, reason: str, retry: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.retry = reason, retry


@dataclass(frozen=True)
class Envelope:
    """What a client sends along with a request to prove it made it, and when."""

    client_name: str
    nonce: bytes
    timestamp: float
    signature: bytes


def _field(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def signed_bytes(
    method: str, client_name: str, nonce: bytes, timestamp: float, body: bytes
) -> bytes:
    """The bytes a request's signature covers (the encoding is in the module docstring)."""
    return _covered(method, client_name, nonce, timestamp, hashlib.sha256(body).digest())


def _covered(method: str, client_name: str, nonce: bytes, timestamp: float, digest: bytes) -> bytes:
    """``signed_bytes`` of a body whose SHA-256 is ``digest`` (hashed once per request,
    however many methods a refusal's reason tries)."""
    return b"".join(
        _field(part)
        for part in (
            DOMAIN,
            method.encode("utf-8"),
            client_name.encode("utf-8"),
            bytes(nonce),
            struct.pack(">d", timestamp),
            digest,
        )
    )


def public_raw(key: Ed25519PrivateKey) -> bytes:
    """The 32 raw bytes of ``key``'s public key (what ``keys.json`` registers)."""
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class Signer:
    """Signs the requests of client ``name`` with its private key."""

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        self.name = check_name(name)
        self._key = private_key

    def sign(self, method: str, body: bytes, now: float | None = None) -> Envelope:
        """The envelope of one request: a fresh random nonce, the time ``now`` (else
        the clock's), and the signature over :func:`signed_bytes`."""
        timestamp = time.time() if now is None else float(now)
        nonce = os.urandom(NONCE_BYTES)
        signature = self._key.sign(signed_bytes(method, self.name, nonce, timestamp, body))
        return Envelope(self.name, nonce, timestamp, signature)


def _public_key(raw: bytes, entry: str) -> Ed25519PublicKey:
    if len(raw) != PUBLIC_KEY_BYTES:
        raise ConfigError(
            f"{entry}: the public key has {len(raw)} bytes; an Ed25519 key has {PUBLIC_KEY_BYTES}"
        )
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise ConfigError(f"{entry}: not an Ed25519 public key ({exc})") from None


class Verifier:
    """Checks request envelopes against the registered public keys; thread-safe.

    ``keys`` maps client name to raw public key; ``revoked`` names clients refused
    whatever they sign. ``methods``, if given, are the RPC methods served: another
    method is refused, and a signature made for one of them but presented for
    another is reported as a wrong method rather than a bad signature. At most
    ``max_nonces_per_client`` nonces of a client are remembered at once; past that
    its requests are refused until older ones leave the window. A timestamp before
    ``not_before`` (default: the clock when the verifier is made, i.e. the server's
    start) is refused: nonces seen before it are not remembered.
    """

    def __init__(
        self,
        keys: Mapping[str, bytes],
        revoked: frozenset[str] = frozenset(),
        max_skew_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        *,
        methods: Collection[str] = (),
        max_nonces_per_client: int = MAX_NONCES_PER_CLIENT,
        not_before: float | None = None,
    ) -> None:
        if not (isinstance(max_skew_s, int | float) and 0 < max_skew_s < math.inf):
            raise ConfigError(f"max_skew_s = {shown(max_skew_s)} is invalid: a number > 0")
        if not (isinstance(max_nonces_per_client, int) and max_nonces_per_client >= 1):
            raise ConfigError(
                f"max_nonces_per_client = {shown(max_nonces_per_client)} is invalid: an int >= 1"
            )
        self._keys = {name: _public_key(raw, f"key of '{name}'") for name, raw in keys.items()}
        self._revoked = frozenset(revoked)
        self._methods = frozenset(methods)
        self._skew = float(max_skew_s)
        self._clock = clock
        self._cap = max_nonces_per_client
        self._not_before = clock() if not_before is None else float(not_before)
        self._lock = threading.Lock()
        self._latest = -math.inf  # the latest clock reading: the replay window never moves back
        self._seen: dict[str, set[bytes]] = {}  # client -> nonces inside the window
        self._expiry: list[tuple[float, str, bytes]] = []  # heap of (timestamp, client, nonce)

    def set_revoked(self, revoked: frozenset[str]) -> None:
        """Replace the revoked names (e.g. after ``revoked.txt`` changed)."""
        with self._lock:
            self._revoked = frozenset(revoked)

    def remembered(self, client_name: str) -> int:
        """How many nonces of ``client_name`` are remembered now."""
        with self._lock:
            return len(self._seen.get(client_name, ()))

    def verify(self, method: str, body: bytes, envelope: Envelope) -> None:
        """Accept the request (return) or raise :class:`AuthError` saying why not."""
        name = envelope.client_name
        if len(name) > MAX_NAME_CHARS:  # never a registered name (files.NAME_RULE)
            raise AuthError(f"client name of {len(name)} characters: at most {MAX_NAME_CHARS}")
        key = self._keys.get(name)
        if key is None:
            raise AuthError(
                f"unknown client {shown(name)}: not among the {len(self._keys)} registered clients"
            )
        if name in self._revoked:
            raise AuthError(f"revoked client '{name}': its requests are refused")
        if self._methods and method not in self._methods:
            allowed = ", ".join(sorted(self._methods))
            raise AuthError(f"unknown method {shown(method)}: allowed are {allowed}")
        self._check_shape(envelope)
        stamp = float(envelope.timestamp)
        now = self._clock()
        with self._lock:
            self._latest = max(self._latest, now)
            self._check_window(stamp, now)
        digest = hashlib.sha256(body).digest()
        if not self._signed(key, method, digest, envelope):
            raise AuthError(self._signature_reason(key, method, digest, envelope))
        self._remember(name, envelope.nonce, stamp, now)

    def _check_window(self, stamp: float, now: float) -> None:
        """Refuse a timestamp more than the skew ahead of ``now`` or behind the latest
        clock reading (the same as ``now`` unless the clock went back; with the lock held)."""
        if stamp > now + self._skew:
            raise AuthError(
                f"timestamp {stamp:.3f} is {stamp - now:.1f} s ahead of the server clock: "
                f"allowed ±{self._skew:g} s"
            )
        if stamp < self._latest - self._skew:
            raise AuthError(
                f"timestamp {stamp:.3f} is {self._latest - stamp:.1f} s behind the server clock: "
                f"allowed ±{self._skew:g} s"
            )
        if stamp < self._not_before:
            raise AuthError(
                f"timestamp {stamp:.3f} is before this server started ({self._not_before:.3f}): "
                "a request signed before a restart is refused; sign it again",
                retry=True,
            )

    def _check_shape(self, envelope: Envelope) -> None:
        """Nonce and signature lengths and a finite timestamp: NaN would slip through
        every comparison of the window check."""
        if not isinstance(envelope.nonce, bytes) or len(envelope.nonce) != NONCE_BYTES:
            size = len(envelope.nonce) if isinstance(envelope.nonce, bytes) else "?"
            raise AuthError(f"nonce of {size} bytes: must be {NONCE_BYTES} bytes")
        if not isinstance(envelope.signature, bytes) or len(envelope.signature) != SIGNATURE_BYTES:
            size = len(envelope.signature) if isinstance(envelope.signature, bytes) else "?"
            raise AuthError(f"signature of {size} bytes: must be {SIGNATURE_BYTES} bytes")
        stamp = envelope.timestamp
        if (
            isinstance(stamp, bool)
            or not isinstance(stamp, int | float)
            or not math.isfinite(stamp)
        ):
            raise AuthError(f"timestamp {shown(stamp)} is invalid: seconds since the epoch")

    @staticmethod
    def _signed(key: Ed25519PublicKey, method: str, digest: bytes, envelope: Envelope) -> bool:
        data = _covered(method, envelope.client_name, envelope.nonce, envelope.timestamp, digest)
        try:
            key.verify(envelope.signature, data)
        except InvalidSignature:
            return False
        return True

    def _signature_reason(
        self, key: Ed25519PublicKey, method: str, digest: bytes, envelope: Envelope
    ) -> str:
        """Why a signature failed: made for another served method, or simply bad (a
        forged request costs the body's hash once and a check per method)."""
        for other in sorted(self._methods - {method}):
            if self._signed(key, other, digest, envelope):
                return f"wrong method: the request was signed for '{other}', not {shown(method)}"
        return (
            f"bad signature from client '{envelope.client_name}': not made with its registered "
            "key over this method, body, nonce and timestamp"
        )

    def _remember(self, name: str, nonce: bytes, stamp: float, now: float) -> None:
        """Refuse a nonce seen within the window, else keep it until it leaves the window.

        Nonces older than the window are forgotten first: their requests are refused as
        stale. The window is checked again here, under the same lock as the forgetting,
        since another thread may have moved it on while the signature was checked.
        """
        with self._lock:
            self._check_window(stamp, now)
            horizon = self._latest - self._skew
            while self._expiry and self._expiry[0][0] < horizon:
                _, old_name, old_nonce = heapq.heappop(self._expiry)
                nonces = self._seen[old_name]
                nonces.discard(old_nonce)
                if not nonces:
                    del self._seen[old_name]
            nonces = self._seen.setdefault(name, set())
            if nonce in nonces:
                raise AuthError(
                    f"nonce {nonce.hex()} replayed: client '{name}' sent it already, "
                    f"within the ±{self._skew:g} s window"
                )
            if len(nonces) >= self._cap:
                raise AuthError(
                    f"client '{name}' sent {len(nonces)} requests within the replay window "
                    f"(limit {self._cap}): refused until older ones leave it"
                )
            nonces.add(nonce)
            heapq.heappush(self._expiry, (stamp, name, nonce))


def generate_identity(path: str | Path, *, force: bool = False) -> bytes:
    """Write a new Ed25519 private key to ``path`` (PEM, mode 0600) and return its raw
    public key. An existing file is kept unless ``force``: a lost identity cannot be
    recovered, and the server would refuse the new key until it is registered."""
    path = Path(path)
    if path.exists() and not force:
        raise ConfigError(f"'{path}' exists: refusing to replace an identity; pass force to")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_atomic(path, pem, 0o600)
    return public_raw(key)


def load_identity(path: str | Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path`` (as :func:`generate_identity` writes it)."""
    path = Path(path)
    pem = read_bytes(path, "the identity file")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"'{path}' is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"'{path}' holds a {type(key).__name__}, not an Ed25519 key")
    return key


def encode_key(public: bytes) -> str:
    """A raw public key as ``keys.json`` stores it: standard base64."""
    return base64.b64encode(public).decode("ascii")


def _no_repeats(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: dict[str, object] = {}
    for name, value in pairs:
        if name in seen:
            raise ConfigError(f"client {shown(name)} appears twice")
        seen[name] = value
    return seen


def load_keys(path: str | Path) -> dict[str, bytes]:
    """Client name -> raw Ed25519 public key, from a ``keys.json`` file; each problem
    (bad JSON, a repeated or bad name, bad base64, a wrong key length) names its entry."""
    path = Path(path)
    text = read_bytes(path, "the keys file")
    try:
        data = json.loads(text, object_pairs_hook=_no_repeats)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, or a repeated name
        raise ConfigError(f"'{path}' is not a valid keys file: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"'{path}' holds a JSON {type(data).__name__}: a keys file is an object "
            '{"client name": "base64 public key", ...}'
        )
    keys: dict[str, bytes] = {}
    for name, value in data.items():
        entry = f"'{path}' entry {shown(name)}"
        check_name(name, f"{entry}: client name")
        if not isinstance(value, str):
            raise ConfigError(f"{entry}: {shown(value)} is not a base64 string")
        try:
            raw = base64.b64decode(value, validate=True)
        except binascii.Error as exc:
            raise ConfigError(f"{entry}: {shown(value)} is not valid base64 ({exc})") from None
        _public_key(raw, entry)
        keys[name] = raw
    return keys


def register_key(path: str | Path, name: str, public: bytes, *, replace: bool = False) -> None:
    """Add client ``name`` with raw public key ``public`` to the keys file at ``path``
    (created if absent), rewriting it atomically. A name registered with another key
    is refused unless ``replace``. Concurrent writers are not coordinated: one at a time."""
    path = Path(path)
    check_name(name)
    _public_key(public, f"key of '{name}'")
    keys = load_keys(path) if path.exists() else {}
    if keys.get(name, public) != public and not replace:
        raise ConfigError(
            f"client '{name}' is registered in '{path}' with another key; pass replace to change it"
        )
    keys[name] = bytes(public)
    text = json.dumps({n: encode_key(k) for n, k in sorted(keys.items())}, indent=2) + "\n"
    write_atomic(path, text.encode("utf-8"), 0o644)

"""A federation's public-key infrastructure: one CA, a server certificate, client certificates.

Mutual TLS between the gRPC server and its clients rests on these files. The CA
signs one server certificate (its SubjectAlternativeName lists the host names and
IP addresses clients dial) and one certificate per client (its common name is the
client's name, which the server reads back with :func:`peer_name`). Keys are ECDSA
on P-256 and certificates are signed with ECDSA-SHA256: the combination gRPC's TLS
(BoringSSL) handles everywhere.

The folder :func:`write_federation` makes::

    ca.pem  ca.key  server.pem  server.key  revoked.txt
    clients/<name>.pem  clients/<name>.key

Private keys (``*.key``) are written 0600. ``revoked.txt`` lists the names of
clients whose certificates the server refuses, one per line (:func:`load_revoked`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable, Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedforge.core.errors import FedforgeError, shown
from fedforge.transport.files import check_name, read_bytes, write_atomic

Key = ec.EllipticCurvePrivateKey

DEFAULT_HOSTS = ("localhost", "127.0.0.1")
CA_DAYS = 3650
LEAF_DAYS = 365
# a certificate is valid from a few minutes before it is made, so that a peer whose
# clock is slightly behind does not refuse it as "not yet valid"
_BACKDATE = dt.timedelta(minutes=5)
REVOKED_HEADER = "# client names whose certificates the server refuses, one per line\n"


class CertError(FedforgeError):
    """A federation's certificate files are missing, damaged, or would be overwritten."""


def _new_key() -> Key:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(
    subject: str,
    issuer: x509.Name,
    public: ec.EllipticCurvePublicKey,
    days: int,
    until: dt.datetime | None = None,
) -> x509.CertificateBuilder:
    """A certificate for ``subject`` (its common name) with a random serial number,
    valid from now (less :data:`_BACKDATE`) for ``days`` days, and not after ``until``."""
    if not isinstance(days, int) or isinstance(days, bool) or days < 1:
        raise CertError(f"validity days = {shown(days)} is invalid: a whole number >= 1")
    now = dt.datetime.now(dt.UTC)
    end = now + dt.timedelta(days=days)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(end if until is None else min(end, until))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )


def _leaf_usage(purpose: x509.ObjectIdentifier) -> list[tuple[x509.ExtensionType, bool]]:
    """The extensions of an end-entity certificate for ``purpose`` (an EKU): not a CA,
    signs TLS handshakes only (ECDSA keys sign; they do not encipher)."""
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    return [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (usage, True),
        (x509.ExtendedKeyUsage([purpose]), False),
    ]


def _sign_leaf(
    ca_key: Key,
    ca_cert: x509.Certificate,
    subject: str,
    purpose: x509.ObjectIdentifier,
    days: int,
    extra: Iterable[x509.ExtensionType] = (),
) -> tuple[Key, x509.Certificate]:
    """A new key and its certificate signed by the CA; the certificate expires no
    later than the CA's own (a peer would refuse the rest of its life anyway)."""
    key = _new_key()
    until = ca_cert.not_valid_after_utc
    builder = _builder(subject, ca_cert.subject, key.public_key(), days, until)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
    )
    for extension, critical in _leaf_usage(purpose):
        builder = builder.add_extension(extension, critical=critical)
    for extension in extra:
        builder = builder.add_extension(extension, critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_ca(name: str = "fedforge CA", *, days: int = CA_DAYS) -> tuple[Key, x509.Certificate]:
    """A self-signed CA (key, certificate) named ``name``, valid ``days`` days; it may
    sign end-entity certificates only (path length 0)."""
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(name, subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _host_name(host: str) -> x509.GeneralName:
    """``host`` as a SAN entry: an IP address if it parses as one, else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host or not host.isascii() or any(c.isspace() or c in "/:@" for c in host):
        raise CertError(
            f"server host {shown(host)} is invalid: a DNS name (ASCII, e.g. 'fl.example.org') "
            "or an IP address"
        )
    return x509.DNSName(host)


def make_server_cert(
    ca_key: Key,
    ca_cert: x509.Certificate,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    *,
    days: int = LEAF_DAYS,
) -> tuple[Key, x509.Certificate]:
    """The server's (key, certificate): TLS server authentication, its SAN listing
    ``hosts`` (the names and addresses clients connect to); common name ``hosts[0]``."""
    if isinstance(hosts, str) or not hosts:
        raise CertError(f"server hosts = {shown(hosts)} is invalid: a non-empty list of names")
    san = x509.SubjectAlternativeName([_host_name(h) for h in hosts])
    return _sign_leaf(ca_key, ca_cert, hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, days, [san])


def make_client_cert(
    ca_key: Key, ca_cert: x509.Certificate, client_name: str, *, days: int = LEAF_DAYS
) -> tuple[Key, x509.Certificate]:
    """The (key, certificate) of client ``client_name``: TLS client authentication,
    common name ``client_name``."""
    check_name(client_name)
    return _sign_leaf(ca_key, ca_cert, client_name, ExtendedKeyUsageOID.CLIENT_AUTH, days)


def _key_pem(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write_pair(key_path: Path, key: Key, cert: x509.Certificate) -> list[Path]:
    """Write a certificate (0644) and its private key (0600) side by side."""
    cert_path = key_path.with_suffix(".pem")
    write_atomic(cert_path, _cert_pem(cert), 0o644)
    write_atomic(key_path, _key_pem(key), 0o600)
    return [cert_path, key_path]


def write_federation(
    out_dir: str | Path,
    clients: Sequence[str],
    hosts: Sequence[str] = DEFAULT_HOSTS,
    *,
    days: int = LEAF_DAYS,
    ca_days: int = CA_DAYS,
    ca_name: str = "fedforge CA",
    force: bool = False,
) -> list[Path]:
    """Make a new CA, server certificate and one certificate per client in ``out_dir``;
    returns the paths written.

    An existing ``ca.key`` is never replaced unless ``force``: a new CA would orphan
    every certificate the old one issued. ``ca.key`` is written last, so a folder
    without it holds no usable federation and a second attempt may overwrite it.
    An existing ``revoked.txt`` is kept (a name revoked stays revoked).
    """
    out = Path(out_dir)
    names = [check_name(c) for c in clients]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CertError(f"client names must be distinct; repeated: {', '.join(repeated)}")
    if (out / "ca.key").exists() and not force:
        raise CertError(
            f"'{out / 'ca.key'}' exists: refusing to replace the federation's CA "
            "(every certificate it issued would stop working); pass force to replace it"
        )
    ca_key, ca_cert = make_ca(ca_name, days=ca_days)
    written: list[Path] = []
    for name in names:
        key, cert = make_client_cert(ca_key, ca_cert, name, days=days)
        written += _write_pair(out / "clients" / f"{name}.key", key, cert)
    key, cert = make_server_cert(ca_key, ca_cert, hosts, days=days)
    written += _write_pair(out / "server.key", key, cert)
    revoked = out / "revoked.txt"
    if not revoked.exists():
        write_atomic(revoked, REVOKED_HEADER.encode(), 0o644)
        written.append(revoked)
    return written + _write_pair(out / "ca.key", ca_key, ca_cert)


def load_ca(out_dir: str | Path) -> tuple[Key, x509.Certificate]:
    """The CA (key, certificate) of the federation in ``out_dir``; checks they match."""
    out = Path(out_dir)
    key_bytes = read_bytes(out / "ca.key", "the CA's private key", CertError)
    cert_bytes = read_bytes(out / "ca.pem", "the CA's certificate", CertError)
    try:
        key = serialization.load_pem_private_key(key_bytes, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(
            f"'{out / 'ca.key'}' is not an unencrypted PEM private key: {exc}"
        ) from None
    if not isinstance(key, Key):
        raise CertError(f"'{out / 'ca.key'}' holds a {type(key).__name__}, not an EC key")
    cert = _load_cert(cert_bytes, str(out / "ca.pem"))
    if cert.public_key() != key.public_key():
        raise CertError(f"'{out / 'ca.key'}' is not the key of the certificate '{out / 'ca.pem'}'")
    return key, cert


def add_client(
    out_dir: str | Path, name: str, *, days: int = LEAF_DAYS, force: bool = False
) -> list[Path]:
    """Issue one more client certificate with the CA in ``out_dir``: writes
    ``clients/<name>.pem`` and ``.key`` and returns their paths. Refuses a name that
    already has a key (unless ``force``) or that ``revoked.txt`` lists."""
    out = Path(out_dir)
    check_name(name)
    key_path = out / "clients" / f"{name}.key"
    if key_path.exists() and not force:
        raise CertError(f"'{key_path}' exists: client '{name}' has a certificate already")
    revoked = out / "revoked.txt"
    if revoked.exists() and name in load_revoked(revoked):
        raise CertError(f"client '{name}' is listed in '{revoked}'; remove it there first")
    ca_key, ca_cert = load_ca(out)
    key, cert = make_client_cert(ca_key, ca_cert, name, days=days)
    return _write_pair(key_path, key, cert)


def _load_cert(pem: bytes, what: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertError(f"{what} is not a PEM certificate: {exc}") from None


def peer_name(cert_pem: bytes) -> str:
    """The client name in a client certificate (PEM): its one common name."""
    cert = _load_cert(cert_pem, "the peer's certificate")
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1 or not isinstance(names[0].value, str):
        raise CertError(
            f"the peer's certificate has {len(names)} common names "
            f"({cert.subject.rfc4514_string()!r}): a client certificate has exactly one"
        )
    return names[0].value


def load_revoked(path: str | Path) -> frozenset[str]:
    """The client names in a revocation list: one per line; blank lines and lines
    starting with '#' are skipped."""
    path = Path(path)
    raw = read_bytes(path, "the revocation list", CertError)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CertError(f"'{path}' is not UTF-8 text: {exc}") from None
    names = set()
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            names.add(check_name(line, f"'{path}' line {number}: client name"))
    return frozenset(names)

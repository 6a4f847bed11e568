"""The security building blocks of the gRPC deployment: a federation's certificates
(they chain to its CA, a real mutual-TLS handshake accepts them and refuses strangers,
private keys are 0600, a CA is never silently replaced) and signed requests (each
refusal names its reason; the replay cache forgets what the window no longer admits)."""

from __future__ import annotations

import base64
import json
import ssl
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID

from fedforge.cli import main
from fedforge.core.errors import ConfigError, FedforgeError
from fedforge.transport import certs
from fedforge.transport.auth import (
    AuthError,
    Envelope,
    Signer,
    Verifier,
    encode_key,
    generate_identity,
    load_identity,
    load_keys,
    public_raw,
    register_key,
    signed_bytes,
)
from fedforge.transport.certs_cli import parse_clients

UPLOAD = "/fedforge.Federation/Upload"
FETCH = "/fedforge.Federation/Fetch"
T0 = 1_700_000_000.0


# ----- certificates ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fed")
    certs.write_federation(out, ["client-0", "client-1"], ["localhost", "127.0.0.1", "fl.test"])
    return out


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_federation_files_chain_to_the_ca(fed: Path) -> None:
    ca = _cert(fed / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server, client = _cert(fed / "server.pem"), _cert(fed / "clients" / "client-1.pem")
    for cert in (server, client):
        cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert cert.not_valid_after_utc <= ca.not_valid_after_utc
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "fl.test"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert _eku(server) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert _eku(client) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert certs.peer_name((fed / "clients" / "client-1.pem").read_bytes()) == "client-1"
    for key in [fed / "ca.key", fed / "server.key", *fed.glob("clients/*.key")]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE((fed / "ca.pem").stat().st_mode) == 0o644
    assert certs.load_revoked(fed / "revoked.txt") == frozenset()
    assert not list(fed.rglob("*.tmp"))


def _handshake(
    fed: Path, client_pem: Path, hostname: str = "localhost", ca: Path | None = None
) -> str:
    """A mutual-TLS handshake in memory between the federation's server and a client
    holding ``client_pem`` (and its .key); returns the client name the server sees."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(fed / "server.pem", fed / "server.key")
    server_ctx.load_verify_locations(fed / "ca.pem")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_cert_chain(client_pem, client_pem.with_suffix(".key"))
    client_ctx.load_verify_locations(ca or fed / "ca.pem")
    bios = [ssl.MemoryBIO() for _ in range(4)]  # client in, client out, server in, server out
    client = client_ctx.wrap_bio(bios[0], bios[1], server_hostname=hostname)
    server = server_ctx.wrap_bio(bios[2], bios[3], server_side=True)
    done = {id(client): False, id(server): False}
    for _ in range(20):
        for end in (client, server):
            try:
                end.do_handshake()
                done[id(end)] = True
            except ssl.SSLWantReadError:
                pass
        bios[2].write(bios[1].read())
        bios[0].write(bios[3].read())
        if all(done.values()):
            der = server.getpeercert(binary_form=True)
            assert der is not None
            pem = ssl.DER_cert_to_PEM_cert(der).encode()
            return certs.peer_name(pem)
    raise AssertionError("the handshake did not finish")


def test_a_real_mutual_tls_handshake_accepts_members_and_refuses_strangers(
    fed: Path, tmp_path: Path
) -> None:
    assert _handshake(fed, fed / "clients" / "client-0.pem") == "client-0"
    assert _handshake(fed, fed / "clients" / "client-1.pem", hostname="fl.test") == "client-1"
    with pytest.raises(ssl.SSLError, match="certificate verify failed"):
        _handshake(fed, fed / "clients" / "client-0.pem", hostname="elsewhere.test")
    other = tmp_path / "other"
    certs.write_federation(other, ["client-0"])  # same name, another CA
    with pytest.raises(ssl.SSLError):
        _handshake(fed, other / "clients" / "client-0.pem")
    with pytest.raises(ssl.SSLError, match="certificate verify failed"):  # trusts another CA
        _handshake(fed, fed / "clients" / "client-0.pem", ca=other / "ca.pem")


def test_an_existing_ca_is_replaced_only_with_force(tmp_path: Path) -> None:
    certs.write_federation(tmp_path, ["a"])
    (tmp_path / "revoked.txt").write_text("a\n")
    before = (tmp_path / "ca.key").read_bytes()
    with pytest.raises(certs.CertError, match=f"'{tmp_path / 'ca.key'}' exists"):
        certs.write_federation(tmp_path, ["b"])
    assert (tmp_path / "ca.key").read_bytes() == before
    assert not (tmp_path / "clients" / "b.pem").exists()
    certs.write_federation(tmp_path, ["b"], force=True)
    assert (tmp_path / "ca.key").read_bytes() != before
    assert certs.load_revoked(tmp_path / "revoked.txt") == {"a"}  # kept


def test_add_client_issues_with_the_existing_ca(fed: Path) -> None:
    written = certs.add_client(fed, "late-joiner")
    assert written == [fed / "clients" / "late-joiner.pem", fed / "clients" / "late-joiner.key"]
    _cert(written[0]).verify_directly_issued_by(_cert(fed / "ca.pem"))
    assert stat.S_IMODE(written[1].stat().st_mode) == 0o600
    assert _handshake(fed, written[0]) == "late-joiner"
    with pytest.raises(certs.CertError, match="has a certificate already"):
        certs.add_client(fed, "late-joiner")


def test_add_client_refuses_a_revoked_name_and_a_missing_ca(tmp_path: Path) -> None:
    certs.write_federation(tmp_path, [])
    (tmp_path / "revoked.txt").write_text("# gone\n\nmallory\n")
    with pytest.raises(certs.CertError, match="'mallory' is listed in"):
        certs.add_client(tmp_path, "mallory")
    with pytest.raises(certs.CertError, match="the CA's private key .* does not exist"):
        certs.add_client(tmp_path / "nowhere", "x")


@pytest.mark.parametrize("name", ["../escape", "", ".hidden", "a/b", "x" * 65, "-rf"])
def test_names_that_are_not_safe_file_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="client name .* is invalid"):
        certs.write_federation(tmp_path, [name])
    assert not (tmp_path / "ca.key").exists()


def test_bad_inputs_name_the_value(tmp_path: Path) -> None:
    with pytest.raises(certs.CertError, match="server host 'no pe' is invalid"):
        certs.write_federation(tmp_path, ["a"], ["no pe"])
    with pytest.raises(certs.CertError, match="repeated: a"):
        certs.write_federation(tmp_path, ["a", "b", "a"])
    with pytest.raises(certs.CertError, match="validity days = 0"):
        certs.write_federation(tmp_path, ["a"], days=0)
    (tmp_path / "revoked.txt").write_text("ok\nnot ok\n")
    with pytest.raises(ConfigError, match="line 2: client name 'not ok' is invalid"):
        certs.load_revoked(tmp_path / "revoked.txt")
    with pytest.raises(certs.CertError, match="not a PEM certificate"):
        certs.peer_name(b"junk")


def test_parse_clients() -> None:
    assert parse_clients("0-2,12") == ["client-0", "client-1", "client-2", "client-12"]
    assert parse_clients("alice, 3,alice") == ["alice", "client-3"]
    for bad, match in [("0-9,,3", "empty item"), ("5-2", "range '5-2' is invalid")]:
        with pytest.raises(ConfigError, match=match):
            parse_clients(bad)


def test_the_cli_writes_certs_and_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fed"
    assert main(["certs", "--out", str(out), "--clients", "0-1,7", "--hosts", "fl.test"]) == 0
    assert "3 client certificates" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "clients").glob("*.pem")) == [
        "client-0.pem",
        "client-1.pem",
        "client-7.pem",
    ]
    assert main(["certs", "--out", str(out), "--clients", "0"]) == 2
    assert "ca.key' exists" in capsys.readouterr().err
    assert main(["certs", "--out", str(out), "--add-client", "late"]) == 0
    assert str(out / "clients" / "late.key") in capsys.readouterr().out

    assert main(["keys", "--out", str(tmp_path / "id.key")]) == 0
    printed = capsys.readouterr().out.split("public key (base64): ")[1].strip()
    assert base64.b64decode(printed) == public_raw(load_identity(tmp_path / "id.key"))
    assert main(["keys", "--out", str(tmp_path / "id.key")]) == 2


# ----- signed requests ------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


ALICE_KEY = Ed25519PrivateKey.generate()


@pytest.fixture
def alice() -> Signer:
    return Signer("alice", ALICE_KEY)


def _verifier(alice: Signer, clock: Callable[[], float], **kw: object) -> Verifier:
    keys = {"alice": public_raw(ALICE_KEY), "bob": public_raw(Ed25519PrivateKey.generate())}
    return Verifier(keys, clock=clock, **kw)  # type: ignore[arg-type]


def test_sign_verify_round_trip(alice: Signer) -> None:
    verifier = _verifier(alice, Clock())
    envelope = alice.sign(UPLOAD, b"update", now=T0 + 3)
    assert len(envelope.nonce) == 16 and envelope.client_name == "alice"
    verifier.verify(UPLOAD, b"update", envelope)
    verifier.verify(UPLOAD, b"update", alice.sign(UPLOAD, b"update", now=T0))  # fresh nonce
    real = Verifier({"alice": public_raw(ALICE_KEY)})  # the real clock
    real.verify(FETCH, b"", alice.sign(FETCH, b""))


def test_the_signed_bytes_are_unambiguous() -> None:
    nonce = bytes(16)
    assert signed_bytes("ab", "c", nonce, T0, b"") != signed_bytes("a", "bc", nonce, T0, b"")
    assert signed_bytes("m", "c", nonce, T0, b"x") != signed_bytes("m", "c", nonce, T0 + 1e-6, b"x")


def test_each_refusal_names_its_reason(alice: Signer) -> None:
    clock = Clock()
    verifier = _verifier(alice, clock, revoked=frozenset({"bob"}))
    good = alice.sign(UPLOAD, b"body", now=T0)
    mallory = Signer("alice", Ed25519PrivateKey.generate())  # alice's name, another key
    bob = Signer("bob", Ed25519PrivateKey.generate())
    cases: list[tuple[str, bytes, Envelope, str]] = [
        (UPLOAD, b"body", Signer("eve", ALICE_KEY).sign(UPLOAD, b"body", T0), "unknown client"),
        (UPLOAD, b"body", bob.sign(UPLOAD, b"body", T0), "revoked client 'bob'"),
        (UPLOAD, b"body", alice.sign(UPLOAD, b"body", T0 + 61), "61.0 s ahead"),
        (UPLOAD, b"body", alice.sign(UPLOAD, b"body", T0 - 75.5), "75.5 s behind"),
        (UPLOAD, b"tampered", good, "bad signature from client 'alice'"),
        (FETCH, b"body", good, "bad signature"),  # no methods given: no diagnosis
        (UPLOAD, b"body", mallory.sign(UPLOAD, b"body", T0), "bad signature"),
        (UPLOAD, b"body", Envelope("alice", b"short", T0, good.signature), "nonce of 5 bytes"),
        (UPLOAD, b"body", Envelope("alice", good.nonce, float("nan"), good.signature), "nan"),
    ]
    for method, body, envelope, reason in cases:
        with pytest.raises(AuthError, match=reason) as caught:
            verifier.verify(method, body, envelope)
        assert reason in caught.value.reason and isinstance(caught.value, FedforgeError)
    with pytest.raises(AuthError, match="s ahead of the server clock: allowed ±60 s$"):
        verifier.verify(*cases[2][:3])
    verifier.verify(UPLOAD, b"body", good)  # none of the refusals used up its nonce
    with pytest.raises(AuthError, match=f"nonce {good.nonce.hex()} replayed"):
        verifier.verify(UPLOAD, b"body", good)


def test_a_signature_for_another_served_method_is_a_wrong_method(alice: Signer) -> None:
    verifier = _verifier(alice, Clock(), methods={UPLOAD, FETCH})
    envelope = alice.sign(FETCH, b"", now=T0)
    with pytest.raises(AuthError, match=f"wrong method: the request was signed for '{FETCH}'"):
        verifier.verify(UPLOAD, b"", envelope)
    with pytest.raises(AuthError, match="unknown method '/x/Y': allowed are /fedforge"):
        verifier.verify("/x/Y", b"", envelope)
    verifier.verify(FETCH, b"", envelope)


def test_the_replay_cache_forgets_nonces_the_window_no_longer_admits(alice: Signer) -> None:
    clock = Clock()
    verifier = _verifier(alice, clock, max_skew_s=10.0)
    old = [alice.sign(UPLOAD, b"", now=T0 + i) for i in range(5)]
    for envelope in old:
        verifier.verify(UPLOAD, b"", envelope)
    assert verifier.remembered("alice") == 5
    clock.now = T0 + 12.5  # the first three are now more than 10 s old
    verifier.verify(UPLOAD, b"", alice.sign(UPLOAD, b"", now=clock.now))
    assert verifier.remembered("alice") == 3
    with pytest.raises(AuthError, match="12.5 s behind"):  # forgotten, yet still refused
        verifier.verify(UPLOAD, b"", old[0])
    with pytest.raises(AuthError, match="replayed"):
        verifier.verify(UPLOAD, b"", old[4])
    clock.now = T0  # the clock goes back: the window does not
    with pytest.raises(AuthError, match="12.5 s behind"):
        verifier.verify(UPLOAD, b"", old[0])
    clock.now = T0 + 100
    verifier.verify(UPLOAD, b"", alice.sign(UPLOAD, b"", now=clock.now))
    assert verifier.remembered("alice") == 1


def test_a_client_past_the_nonce_cap_is_refused_until_the_window_moves(alice: Signer) -> None:
    clock = Clock()
    verifier = _verifier(alice, clock, max_skew_s=5.0, max_nonces_per_client=3)
    for _ in range(3):
        verifier.verify(UPLOAD, b"", alice.sign(UPLOAD, b"", now=T0))
    with pytest.raises(AuthError, match=r"3 requests within the replay window \(limit 3\)"):
        verifier.verify(UPLOAD, b"", alice.sign(UPLOAD, b"", now=T0))
    clock.now = T0 + 6
    verifier.verify(UPLOAD, b"", alice.sign(UPLOAD, b"", now=clock.now))


def test_concurrent_replays_are_accepted_once(alice: Signer) -> None:
    verifier = _verifier(alice, Clock())
    envelope = alice.sign(UPLOAD, b"x" * 1000, now=T0)

    def attempt(_: int) -> bool:
        try:
            verifier.verify(UPLOAD, b"x" * 1000, envelope)
        except AuthError as exc:
            assert "replayed" in exc.reason
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(attempt, range(64))) == 1


# ----- identities and the keys file -----------------------------------------------------


def test_identities_and_the_keys_file(tmp_path: Path) -> None:
    public = generate_identity(tmp_path / "alice.key")
    assert stat.S_IMODE((tmp_path / "alice.key").stat().st_mode) == 0o600
    assert public_raw(load_identity(tmp_path / "alice.key")) == public
    with pytest.raises(ConfigError, match="exists: refusing to replace an identity"):
        generate_identity(tmp_path / "alice.key")
    keys = tmp_path / "keys.json"
    register_key(keys, "alice", public)
    register_key(keys, "alice", public)  # the same key again: nothing changes
    other = generate_identity(tmp_path / "bob.key")
    register_key(keys, "bob", other)
    assert load_keys(keys) == {"alice": public, "bob": other}
    assert json.loads(keys.read_text())["bob"] == encode_key(other)
    with pytest.raises(ConfigError, match="'alice' is registered .* with another key"):
        register_key(keys, "alice", other)
    register_key(keys, "alice", other, replace=True)
    assert load_keys(keys)["alice"] == other
    verifier = Verifier(load_keys(keys))
    verifier.verify(
        UPLOAD, b"", Signer("bob", load_identity(tmp_path / "bob.key")).sign(UPLOAD, b"")
    )


def test_load_identity_refuses_other_keys(tmp_path: Path) -> None:
    certs.write_federation(tmp_path, [])
    with pytest.raises(ConfigError, match="not an Ed25519 key"):
        load_identity(tmp_path / "ca.key")
    with pytest.raises(ConfigError, match="the identity file .* does not exist"):
        load_identity(tmp_path / "none.key")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "is not a valid keys file"),
        ("[]", "holds a JSON list"),
        ('{"a": "AAAA", "a": "AAAA"}', "client 'a' appears twice"),
        ('{"alice": 12}', "entry 'alice': 12 is not a base64 string"),
        ('{"alice": "not*base64"}', "entry 'alice': 'not\\*base64' is not valid base64"),
        ('{"alice": "AAAA"}', "entry 'alice': the public key has 3 bytes; an Ed25519 key has 32"),
        ('{"../x": "AAAA"}', "entry '../x': client name '../x' is invalid"),
    ],
)
def test_keys_file_errors_name_the_entry(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "keys.json").write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_keys(tmp_path / "keys.json")


def test_a_raw_key_of_the_wrong_length_is_refused_by_the_verifier() -> None:
    key = Ed25519PrivateKey.generate().public_key()
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(ConfigError, match="key of 'alice': the public key has 44 bytes"):
        Verifier({"alice": der})

"""What a deployment server refuses, over real gRPC on loopback (the server in
this process, its clients in threads): unknown, revoked, replayed and stale
senders, malformed, oversize and corrupt uploads, an answer for the wrong model
version, a second answer; fuzzed messages. None of it reaches the model: the run
ends where the simulator ends."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy_procs import write_config
from fedforge import config as config_mod
from fedforge import run
from fedforge.selection.sampling import sample_cohort
from fedforge.transport.auth import Signer, generate_identity, load_identity, register_key
from fedforge.transport.certs import write_federation
from fedforge.transport.client import ClientProcess
from fedforge.transport.client_options import ClientOptions
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc
from fedforge.transport.security import ClientSecurity, ServerSecurity
from fedforge.transport.serve import Deployment, ServerOptions, _served

ALICE_IDS = [0, 1, 2]


class Tampering(ClientProcess):
    """Alice: each update is first sent for another model version, then for the
    right one, then once more (a retry after a lost reply), then changed; the
    server's verdicts are kept."""

    verdicts: list[tuple[str, pb.UploadReply]]

    def _upload(
        self, work: pb.Work, kind: str, data: bytes, timing: pb.Timing | None = None
    ) -> None:
        if kind != "update":
            super()._upload(work, kind, data, timing)
            return
        wrong = pb.Work()
        wrong.CopyFrom(work)
        wrong.model_version += 7
        self.verdicts.append(("wrong version", self.send(wrong, kind, data)))
        self.verdicts.append(("corrupt", self._corrupt(work, data)))
        self.verdicts.append(("answer", self.send(work, kind, data)))
        self.verdicts.append(("again", self.send(work, kind, data)))
        self.verdicts.append(("changed", self.send(work, kind, data[:-1] + bytes([data[-1] ^ 1]))))


def _corrupt_upload(self: ClientProcess, work: pb.Work, data: bytes) -> pb.UploadReply:
    """``data`` with its last byte flipped under the header of the true bytes."""
    header = pb.UploadHeader(
        session=self.session,
        client_id=work.client_id,
        round_idx=work.round_idx,
        model_version=work.model_version,
        kind="update",
        size=len(data),
        sha256=hashlib.sha256(data).digest(),
    )
    bad = data[:-1] + bytes([data[-1] ^ 1])
    parts = [
        pb.UploadPart(header=self._signed("Upload", header.SerializeToString())),
        pb.UploadPart(data=bad),
    ]
    try:
        return self.stub.Upload(iter(parts), timeout=30)
    except grpc.RpcError as exc:
        return pb.UploadReply(accepted=False, reason=f"{exc.code().name}: {exc.details()}")


Tampering._corrupt = _corrupt_upload  # type: ignore[attr-defined]


def _federation(tmp: Path) -> Path:
    fed = tmp / "fed"
    write_federation(fed, [], ("localhost", "127.0.0.1"))
    for name in ("alice", "bob", "eve"):
        register_key(fed / "keys.json", name, generate_identity(tmp / f"{name}.key"))
    generate_identity(tmp / "mallory.key")  # never registered
    (fed / "revoked.txt").write_text("eve\n")
    (fed / "members.json").write_text('{"alice": "0-2", "bob": "3-5"}')
    return fed


def _stub(port: int, fed: Path) -> pb_grpc.FederationStub:
    creds = grpc.ssl_channel_credentials((fed / "ca.pem").read_bytes())
    return pb_grpc.FederationStub(grpc.secure_channel(f"127.0.0.1:{port}", creds))


def _signed(signer: Signer, method: str, body: bytes, now: float | None = None) -> pb.Signed:
    e = signer.sign(method, body, now)
    auth = pb.Auth(
        client=e.client_name, nonce=e.nonce, timestamp=e.timestamp, signature=e.signature
    )
    return pb.Signed(auth=auth, body=body)


def _refused(call, *args) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=10)
    return info.value


def _hostile_requests(stub: pb_grpc.FederationStub, tmp: Path, max_bytes: int) -> None:
    hello = pb.HelloRequest().SerializeToString()
    for name, why in (("mallory", "unknown client"), ("eve", "revoked")):
        err = _refused(
            stub.Hello, _signed(Signer(name, load_identity(tmp / f"{name}.key")), "Hello", hello)
        )
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED and why in err.details()
    alice = Signer("alice", load_identity(tmp / "alice.key"))
    once = _signed(alice, "Hello", hello)
    assert stub.Hello(once, timeout=10).run_name == "dep"
    assert "replayed" in _refused(stub.Hello, once).details()
    stale = _signed(alice, "Hello", hello, now=time.time() - 3600)
    assert "timestamp" in _refused(stub.Hello, stale).details()
    tampered = _signed(alice, "Join", pb.JoinRequest().SerializeToString())
    tampered.body = pb.JoinRequest(members=[pb.Member(client_id=0)]).SerializeToString()
    assert _refused(stub.Join, tampered).code() == grpc.StatusCode.UNAUTHENTICATED
    garbage = _signed(alice, "Join", b"\x0a\xff\xff\xff\x0f")
    err = _refused(stub.Join, garbage)
    assert (
        err.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed JoinRequest" in err.details()
    )

    def upload(size: int, data: bytes, digest: bytes) -> grpc.RpcError:
        header = pb.UploadHeader(session="x", client_id=0, kind="update", size=size, sha256=digest)
        parts = [pb.UploadPart(header=_signed(alice, "Upload", header.SerializeToString()))]
        parts.append(pb.UploadPart(data=data))
        return _refused(stub.Upload, iter(parts))

    assert upload(max_bytes + 1, b"x", b"").code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # an upload nobody asked for is refused before its body is read
    err = upload(3, b"abc", hashlib.sha256(b"abc").digest())
    assert err.code() == grpc.StatusCode.NOT_FOUND and "unknown session" in err.details()


def test_refusals_leave_the_model_as_the_simulator_makes_it(tmp_path: Path) -> None:
    fed = _federation(tmp_path)
    cfg_path = write_config(tmp_path / "cfg.yaml", runs_dir=str(tmp_path / "runs"))
    cfg = _served(config_mod.load(cfg_path))
    dep = Deployment(cfg, ServerOptions(ServerSecurity("keys", fed), port=0))
    dep.start()
    target = f"127.0.0.1:{dep.port}"
    alice = Tampering(
        ClientOptions(
            target, ClientSecurity("keys", "alice", fed, tmp_path / "alice.key"), ALICE_IDS
        )
    )
    alice.verdicts = []
    bob = ClientProcess(
        ClientOptions(target, ClientSecurity("keys", "bob", fed, tmp_path / "bob.key"), [3, 4, 5])
    )
    threads = [threading.Thread(target=c.run, daemon=True) for c in (alice, bob)]
    try:
        for t in threads:
            t.start()
        dep.wait_for_clients()
        _hostile_requests(
            _stub(dep.port, fed), tmp_path, int(cfg.deployment.max_message_mib * 2**20)
        )
        deployed = run(cfg, engine=dep.engine).params
    finally:
        dep.stop("the run ended")
    for t in threads:
        t.join(30)
    simulated = run(config_mod.override(cfg, {"runs_dir": str(tmp_path / "sim")})).params
    assert (deployed - simulated).abs().max().item() <= 1e-9
    # alice's clients in the cohorts: each sent one wrong-version, one good, one
    # repeated and one changed update
    asked = sum(len(set(sample_cohort(6, 0.5, cfg.seed, r)) & set(ALICE_IDS)) for r in range(3))
    assert asked > 0
    by_kind: dict[str, list[pb.UploadReply]] = {}
    for kind, reply in alice.verdicts:
        by_kind.setdefault(kind, []).append(reply)
    assert [r.accepted for r in by_kind["answer"]] == [True] * asked
    assert by_kind["again"] == by_kind["answer"]  # the repeat hears the first's verdict
    assert all(
        "model version 7" in r.reason or "version" in r.reason for r in by_kind["wrong version"]
    )
    assert not any(r.accepted for r in by_kind["wrong version"] + by_kind["changed"])
    assert all("DATA_LOSS" in r.reason and "SHA-256" in r.reason for r in by_kind["corrupt"])
    assert len(by_kind["corrupt"]) == asked
    assert len(by_kind["changed"]) == asked
    assert all("a second, different update of client" in r.reason for r in by_kind["changed"])
    count = dep.metrics.registry.get_sample_value
    assert count("fedforge_refused_total", {"reason": "duplicate"}) == asked
    assert count("fedforge_refused_total", {"reason": "wrong_version"}) == asked
    assert count("fedforge_refused_total", {"reason": "oversize"}) == 1
    assert count("fedforge_refused_total", {"reason": "corrupt"}) == asked


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("fuzz")
    cfg = _served(config_mod.load(write_config(tmp / "cfg.yaml")))
    dep = Deployment(cfg, ServerOptions(ServerSecurity("insecure"), port=0))
    dep.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{dep.port}")
    yield dep, pb_grpc.FederationStub(channel)
    channel.close()
    dep.stop("done")


HANDLED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DATA_LOSS,
}


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(method=st.sampled_from(["Hello", "Join", "Poll", "Download"]), body=st.binary(max_size=64))
def test_fuzzed_requests_are_answered_or_refused(open_server, method: str, body: bytes) -> None:  # type: ignore[no-untyped-def]
    dep, stub = open_server
    try:
        reply = getattr(stub, method)(pb.Signed(auth=pb.Auth(client="fuzz"), body=body), timeout=10)
        if method == "Download":
            list(reply)
    except grpc.RpcError as exc:
        assert exc.code() in HANDLED, (exc.code(), exc.details())
    assert dep.hub.accepted == 0  # nothing was taken as an answer: the model cannot move


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.lists(st.tuples(st.booleans(), st.binary(max_size=48)), max_size=4))
def test_fuzzed_uploads_are_refused(open_server, parts: list[tuple[bool, bytes]]) -> None:  # type: ignore[no-untyped-def]
    dep, stub = open_server
    msgs = [
        pb.UploadPart(header=pb.Signed(auth=pb.Auth(client="fuzz"), body=b))
        if is_header
        else pb.UploadPart(data=b)
        for is_header, b in parts
    ]
    try:
        reply = stub.Upload(iter(msgs), timeout=10)
        assert not reply.accepted
    except grpc.RpcError as exc:
        assert exc.code() in HANDLED, (exc.code(), exc.details())
    assert dep.hub.accepted == 0
    assert stub.Hello(pb.Signed(body=b""), timeout=10).run_name == "dep"  # still serving


@pytest.mark.slow
def test_a_silent_upload_stream_is_cancelled_and_frees_its_thread(open_server) -> None:  # type: ignore[no-untyped-def]
    """A peer that opens an upload stream and sends nothing is cut off when its
    header has not come within the request wait, not left holding the call; the
    server goes on serving."""
    dep, stub = open_server
    release = threading.Event()

    def silent() -> Iterator[pb.UploadPart]:
        release.wait(30)
        yield from ()

    limit = dep.admission.request_wait_s
    before = dep.admission.cut
    t0 = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.Upload(silent(), timeout=30)
    finally:
        release.set()
    waited = time.monotonic() - t0
    assert err.value.code() == grpc.StatusCode.CANCELLED
    assert limit <= waited < limit + 5, waited
    assert dep.admission.cut == before + 1
    assert dep.hub.accepted == 0
    assert stub.Hello(pb.Signed(body=b""), timeout=10).run_name == "dep"  # still serving


def test_clients_are_not_sent_the_servers_alert_hooks(tmp_path: Path) -> None:
    """The config a client is sent has no alert rules: a webhook URL carries its
    secret in its path, and a client never runs the server's hooks."""
    rule = {"kind": "no_progress", "threshold": 3, "url": "https://hooks.example/T0PSECRET"}
    cfg = _served(config_mod.load(write_config(tmp_path / "cfg.yaml", alerts={"rules": [rule]})))
    assert cfg.alerts.rules  # the server keeps them
    dep = Deployment(cfg, ServerOptions(ServerSecurity("insecure"), port=0))
    dep.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{dep.port}")
    try:
        hello = pb_grpc.FederationStub(channel).Hello(pb.Signed(body=b""), timeout=10)
    finally:
        channel.close()
        dep.stop("done")
    assert "T0PSECRET" not in hello.config_yaml and "hooks.example" not in hello.config_yaml
    assert config_mod.from_dict(yaml.safe_load(hello.config_yaml)).alerts.rules == ()

"""Who may claim what, against real ``fedforge server`` processes on loopback: the
ids bound to each certificate (``members.json``, written by ``fedforge certs``),
a client signing from ``auth.py``'s docstring alone, a signed request replayed
to a restarted server, a name of a mebibyte, and the answer to a NaN update."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attack_identity import documented_method, hello, join, refusal, signed, tls_stub
from deploy_procs import FEDFORGE, _env, start_client, start_server, write_config
from deploy_sim import _store_file
from fedforge.cli import main
from fedforge.transport.auth import encode_key
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc


def _certs(out: Path, *args: str) -> None:
    assert main(["certs", "--out", str(out), *args]) == 0


def _joined(proc_log: Path) -> list[int]:
    for line in proc_log.read_text().splitlines():
        if '"joined"' in line:
            return list(json.loads(line)["clients"])
    return []


def test_certs_bind_each_certificate_to_its_ids_and_the_server_holds_to_them(
    tmp_path: Path,
) -> None:
    """client-1 claims all six ids first: the server takes only 3-5 from it, and
    client-0 still gets 0-2."""
    fed = tmp_path / "fed"
    _certs(fed, "--clients", "0-1", "--ids-per-client", "3")
    binding = json.loads((fed / "members.json").read_text())
    assert binding == {"client-0": "0-2", "client-1": "3-5"}  # client-K: 3K..3K+2
    cfg = write_config(tmp_path / "cfg.yaml", rounds=1)
    server, port = start_server(tmp_path, cfg, "--certs", str(fed))
    thief = start_client(tmp_path, port, "0-5", "--certs", str(fed), "--name", "client-1")
    end = time.monotonic() + 60
    while not _joined(thief.log) and time.monotonic() < end:
        time.sleep(0.1)
    assert _joined(thief.log) == [3, 4, 5], thief.log.read_text()
    refused = [e for e in thief.events() if e.get("event") == "join_refused"]
    assert [e["client"] for e in refused] == [0, 1, 2]
    assert all("not among the ids 'client-1' may host" in e["reason"] for e in refused)
    owner = start_client(tmp_path, port, "0-2", "--certs", str(fed), "--name", "client-0")
    assert server.wait(120) == 0, server.log.read_text()
    for c in (thief, owner):
        assert c.wait(60) == 0, c.log.read_text()
    assert _joined(owner.log) == [0, 1, 2]


def test_a_server_without_a_binding_refuses_to_start_unless_told_any_member(
    tmp_path: Path,
) -> None:
    fed = tmp_path / "fed"
    _certs(fed, "--clients", "0-1")
    (fed / "members.json").unlink()
    cfg = write_config(tmp_path / "cfg.yaml")
    (fed / "keys.json").write_text("{}")
    refused = {  # both at once: each process spends most of its time importing
        auth: subprocess.Popen(
            [*FEDFORGE, "server", "--config", str(cfg), "--certs", str(fed), "--auth", auth]
            + ["--port", "0", "--runs-dir", str(tmp_path / "runs")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for auth in ("mtls", "keys")
    }
    server, _ = start_server(tmp_path, cfg, "--certs", str(fed), "--any-member")
    try:
        assert "WARNING: --any-member" in server.log.read_text()
    finally:
        server.kill()
    for proc in refused.values():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "members.json' does not exist" in lines[0], err
        assert "--any-member" in lines[0] and "--members client-0=0-24" in lines[0]


def _keys_federation(tmp: Path) -> tuple[Path, Ed25519PrivateKey]:
    fed = tmp / "fed"
    _certs(fed, "--clients", "0")
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (fed / "keys.json").write_text(json.dumps({"alice": encode_key(raw)}))
    (fed / "members.json").write_text('{"alice": "0-1"}')
    return fed, key


@pytest.mark.slow
def test_a_client_signing_from_the_docstring_is_accepted_and_a_replay_after_restart_is_refused(
    tmp_path: Path,
) -> None:
    fed, key = _keys_federation(tmp_path)
    assert documented_method("Join") == "Join"
    cfg = write_config(tmp_path / "cfg.yaml", num_clients=2, rounds=2)
    keys = ("--certs", str(fed), "--auth", "keys")
    server, port = start_server(tmp_path, cfg, *keys)
    stub = tls_stub(port, fed / "ca.pem")
    kept = signed(key, "alice", "Hello", hello())
    assert stub.Hello(kept, timeout=30).run_name == "dep"
    joined = stub.Join(signed(key, "alice", "Join", join([0, 1])), timeout=30)
    assert list(joined.accepted) == [0, 1]
    # a name of a mebibyte costs a log line of bounded size
    size = server.log.stat().st_size
    err = refusal(stub.Hello, signed(key, "m" * (1 << 20), "Hello", hello()))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(err.details()) < 300
    time.sleep(0.5)
    assert server.log.stat().st_size - size < 2000
    sender = [e["sender"] for e in server.events() if e.get("event") == "refused"][-1]
    assert sender == "m" * 64 + f"...[{(1 << 20) - 64} more characters]"
    end = time.monotonic() + 60
    while _store_file(tmp_path) is None and time.monotonic() < end:
        time.sleep(0.1)
    db = _store_file(tmp_path)
    assert db is not None, server.log.read_text()
    server.kill(signal.SIGTERM)
    resumed, port = start_server(tmp_path, None, *keys, "--resume", str(db.parent))
    try:
        stub = tls_stub(port, fed / "ca.pem")
        err = refusal(stub.Hello, kept)  # signed 1-2 s ago: inside the skew window
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
        assert "before this server started" in err.details()
        assert stub.Hello(signed(key, "alice", "Hello", hello()), timeout=30).run_name == "dep"
    finally:
        resumed.kill()


def test_a_nan_update_is_answered_refused_with_the_reason(tmp_path: Path) -> None:
    """Client 3 of six is an attacker sending NaN and inf: each of its uploads is
    answered refused, saying why; the honest ones are answered accepted."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        client_fraction=1.0,
        rounds=2,
        robust={"attack": "nan_inf", "attack_fraction": 0.17},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
    # an unauthenticated claim is believed, but not one over 64 characters
    stub = pb_grpc.FederationStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    long = pb.Signed(auth=pb.Auth(client="x" * 65), body=hello())
    err = refusal(stub.Hello, long)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "client name of 65 characters: at most 64"
    assert server.wait(180) == 0, server.log.read_text()
    for c in clients:
        assert c.wait(60) == 0, c.log.read_text()
    from fedforge import config as config_mod
    from fedforge.robust.attacks import attacker_ids

    bad = attacker_ids(6, 0.17, config_mod.load(cfg).seed)
    assert len(bad) == 1
    refused = [e for c in clients for e in c.events() if e.get("event") == "upload_refused"]
    assert sorted(e["client"] for e in refused) == sorted(bad) * 2
    assert all("finite" in e["reason"] for e in refused), refused


def test_certs_members_spec_add_client_and_mistakes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fed = tmp_path / "fed"
    _certs(fed, "--clients", "0-1,site", "--members", "client-0=0-9,12,client-1=10-11,site=13")
    assert json.loads((fed / "members.json").read_text()) == {
        "client-0": "0-9,12",
        "client-1": "10-11",
        "site": "13",
    }
    _certs(fed, "--add-client", "client-9", "--members", "client-9=100-101")
    assert json.loads((fed / "members.json").read_text())["client-9"] == "100-101"
    _certs(fed, "--members", "client-0=0-4,client-1=5-9")  # rebinds the whole federation
    assert json.loads((fed / "members.json").read_text()) == {"client-0": "0-4", "client-1": "5-9"}
    capsys.readouterr()
    mistakes = {
        ("--members", "client-0=0-5,client-1=5"): "client id 5 is bound to both",
        ("--members", "0-5"): "expected NAME=IDS first",
        ("--members", "client-0=0-1000000000"): "more than 10000000 ids",
        ("--clients", "0-1", "--ids-per-client", "0"): "--ids-per-client 0 is invalid",
        ("--clients", "0-1", "--ids-per-client", "10000000"): "from 1 to 5000000 for 2",
    }
    for args, said in mistakes.items():
        assert main(["certs", "--out", str(fed), *args]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    other = tmp_path / "other"
    assert main(["certs", "--out", str(other), "--clients", "alice,bob"]) == 2
    assert "give every client its ids with --members" in capsys.readouterr().err
    assert main(["certs", "--out", str(other), "--clients", "0-1", "--members", "client-0=0"]) == 2
    assert "no ids for client-1" in capsys.readouterr().err
    assert not (other / "ca.key").exists()  # refused before anything was written


def test_any_member_and_a_members_file_contradict_each_other(tmp_path: Path) -> None:
    from fedforge.core.errors import ConfigError
    from fedforge.transport.security import ServerSecurity

    fed = tmp_path / "fed"
    _certs(fed, "--clients", "0-1", "--ids-per-client", "2")
    assert ServerSecurity("mtls", fed).members() == {
        "client-0": frozenset({0, 1}),
        "client-1": frozenset({2, 3}),
    }
    with pytest.raises(ConfigError, match="--any-member with .*members.json"):
        ServerSecurity("mtls", fed, any_member=True).members()
    (fed / "members.json").write_text('{"a": "0-3", "b": "3"}')
    with pytest.raises(ConfigError, match="client id 3 is bound to both 'a' and 'b'"):
        ServerSecurity("keys", fed).members()
    assert ServerSecurity("insecure").members() is None

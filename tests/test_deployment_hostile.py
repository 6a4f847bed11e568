"""A hostile peer against a real ``fedforge server`` on loopback: the attack client
(``attack_client.py``, written against the .proto's generated code alone) in a
process of its own, beside honest ``fedforge client`` processes.

- calls that open and never send their request, from a peer without a key, do
  not stop the federation, and it finishes once they stop;
- a Hello far larger than any request is refused before it is read whole;
- an honest client told RESOURCE_EXHAUSTED backs off and finishes the run;
- a revoked client certificate fails the TLS handshake;
- a client's retries count toward its --give-up-s;
and, with the server in this process, its limits per connection and per name,
and the client's backoff.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from deploy_procs import Proc, run_dir_of, start_client, start_server, write_config
from deploy_sim import free_port
from fedforge import config as config_mod
from fedforge.config.deployment import DeploymentConfig
from fedforge.store.final import load_final
from fedforge.transport.admission import CALLS_PER_NAME, REQUEST_WAIT_S, STREAMS_PER_CONNECTION
from fedforge.transport.auth import generate_identity, register_key
from fedforge.transport.backoff import Backoff, retrying
from fedforge.transport.certs import write_federation
from fedforge.transport.members import write_members
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc
from fedforge.transport.security import ServerSecurity
from fedforge.transport.serve import Deployment, ServerOptions, _served

ATTACK = Path(__file__).with_name("attack_client.py")


def attack(
    tmp: Path, port: int, *args: str, host: str = "127.0.0.1"
) -> tuple[subprocess.Popen[str], Path]:
    """The attack client as a process, calling from ``host``'s loopback (IPv4 or
    ``[::1]``: another peer address); its output goes to a file."""
    out = tmp / f"attack-{time.monotonic_ns()}.jsonl"
    cmd = [sys.executable, str(ATTACK), args[0], "--target", f"{host}:{port}", *args[1:]]
    with out.open("w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
    return p, out


def attack_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]


def holding(p: subprocess.Popen[str], out: Path, timeout: float = 60) -> None:
    """Until the attack holds its calls open."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(e.get("event") == "holding" for e in attack_lines(out)):
            return
        assert p.poll() is None, out.read_text()
        time.sleep(0.1)
    raise AssertionError(f"the attack did not start:\n{out.read_text()}")


def keys_federation(tmp: Path) -> Path:
    fed = tmp / "fed"
    write_federation(fed, [], ("localhost", "127.0.0.1"))
    for name in ("alice", "bob"):
        register_key(fed / "keys.json", name, generate_identity(tmp / f"{name}.key"))
    write_members(fed / "members.json", {"alice": [0, 1, 2], "bob": [3, 4, 5]})
    return fed


def keys_clients(tmp: Path, port: int, fed: Path) -> list[Proc]:
    return [
        start_client(
            tmp, port, ids, "--certs", str(fed), "--auth", "keys", "--name", n, "--key", str(k)
        )
        for ids, n, k in (("0-2", "alice", tmp / "alice.key"), ("3-5", "bob", tmp / "bob.key"))
    ]


def rounds_done(server: Proc) -> int:
    """The rounds the server's store holds so far."""

    for db in (server.log.parent / "runs").glob("[!.]*/store.sqlite"):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])
        except sqlite3.OperationalError:  # being created
            pass
    return 0


def test_idle_calls_without_credentials_do_not_stop_the_federation(tmp_path: Path) -> None:
    """A peer with no key on IPv6 loopback opens 40 calls and never sends their
    requests (opening each again whenever the server ends it): it holds its
    address's 32, the 8 past them are answered RESOURCE_EXHAUSTED at once, and
    two honest clients on IPv4 loopback join and train meanwhile: rounds complete
    during the attack, the run finishes, and every process exits 0."""
    fed = keys_federation(tmp_path)
    cfg = write_config(tmp_path / "cfg.yaml", rounds=4)
    keys = ("--certs", str(fed), "--auth", "keys", "--host", "localhost")  # IPv4 and IPv6
    server, port = start_server(tmp_path, cfg, *keys)
    hold_s = 40.0  # the run takes about 15 s after the wait below
    cap = DeploymentConfig().pending_per_address
    p, out = attack(
        tmp_path,
        port,
        "idle",
        "--calls",
        str(cap + 8),
        "--hold-s",
        str(hold_s),
        "--ca",
        str(fed / "ca.pem"),
        "--tls-name",
        "localhost",
        host="[::1]",
    )
    try:
        holding(p, out)
        # the honest clients come once the server has cut the idle calls that
        # sent nothing within its request wait: the attack is then known to be
        # held and cut, whatever the run's own length
        time.sleep(REQUEST_WAIT_S + 1.0)
        clients = keys_clients(tmp_path, port, fed)
        assert server.wait(hold_s + 60) == 0, server.log.read_text()
        trained_during = p.poll() is None  # the whole run ran under the attack
        assert trained_during, f"the run outlasted a {hold_s:g} s attack:\n{out.read_text()}"
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        p.terminate()
        p.wait(30)
    assert rounds_done(server) == 4
    ended = attack_lines(out)[-1]
    assert ended["event"] == "idle" and ended["opened"] >= cap + 8
    # the idle calls were cut by the server or refused past the cap, none answered
    # (UNAVAILABLE: once it exited, the attack still holding)
    assert set(ended["ended"]) <= {"CANCELLED", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}, ended
    assert ended["ended"].get("CANCELLED", 0) >= cap, ended
    assert ended["ended"].get("RESOURCE_EXHAUSTED", 0) >= 8, ended
    busy = [e["reason"] for e in server.events() if e.get("event") == "refused"]
    assert any(f"ipv6:[::1] has {cap} calls waiting" in r for r in busy), busy[:5]
    assert load_final(tmp_path / run_dir_of(server))["params"].numel() > 0


def test_an_oversize_hello_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    """Four Hellos of 64 MiB at once: each refused (RESOURCE_EXHAUSTED), and the
    server's peak memory grows by less than one of them."""
    cfg = write_config(tmp_path / "cfg.yaml")
    server, port = start_server(tmp_path, cfg, "--insecure")
    try:
        before = peak_rss_mib(server)
        p, out = attack(tmp_path, port, "oversize", "--calls", "4", "--mib", "64")
        assert p.wait(120) == 0, out.read_text()
        after = peak_rss_mib(server)
        assert after - before < 64, (before, after)
        assert attack_lines(out)[-1]["ended"] == {"RESOURCE_EXHAUSTED": 4}
    finally:
        server.kill()


def peak_rss_mib(proc: Proc) -> float:
    """The process's peak resident memory (VmHWM), MiB."""
    for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_an_honest_client_backs_off_when_the_server_is_busy(tmp_path: Path) -> None:
    """40 idle calls from loopback pass the per-address limit (32): the honest
    client's calls from the same address are told RESOURCE_EXHAUSTED. It waits
    with backoff (logged), and once the attack stops it joins and the run ends."""
    cfg = write_config(tmp_path / "cfg.yaml")
    server, port = start_server(tmp_path, cfg, "--insecure")
    calls = DeploymentConfig().pending_per_address + 8
    p, out = attack(tmp_path, port, "idle", "--calls", str(calls), "--hold-s", "90")
    try:
        holding(p, out)
        clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
        end = time.monotonic() + 60
        while not all(retried(c) for c in clients) and time.monotonic() < end:
            time.sleep(0.2)
        p.terminate()  # each honest client has been told RESOURCE_EXHAUSTED: stop
        assert server.wait(150) == 0, server.log.read_text()
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        p.terminate()
        p.wait(30)
    retries = [e for c in clients for e in c.events() if e.get("event") == "retry"]
    assert all(retried(c) for c in clients), retries
    assert all(0 < e["pause_s"] <= 7.5 for e in retries)  # 5 s at most, jittered by 1.5
    busy = [e for e in server.events() if e.get("event") == "refused"]
    assert any("calls waiting for their request" in e["reason"] for e in busy)
    assert rounds_done(server) == 3


def retried(client: Proc) -> bool:
    """Whether ``client`` was told RESOURCE_EXHAUSTED and retried."""
    return any(
        e.get("event") == "retry" and e["code"] == "RESOURCE_EXHAUSTED" for e in client.events()
    )


def test_a_revoked_certificate_fails_the_tls_handshake(tmp_path: Path) -> None:
    """Under mutual TLS the revoked client's certificate is refused in the
    handshake (the call never reaches the server: UNAVAILABLE), the others' are
    served."""
    fed = tmp_path / "fed"
    write_federation(fed, ["alice", "eve"], ("localhost", "127.0.0.1"))
    (fed / "revoked.txt").write_text("eve\n")
    cfg = write_config(tmp_path / "cfg.yaml")
    server, port = start_server(tmp_path, cfg, "--certs", str(fed), "--any-member")
    try:
        answers = {}
        for name in ("alice", "eve"):
            mine = ["--cert", str(fed / "clients" / f"{name}.pem")]
            mine += ["--key", str(fed / "clients" / f"{name}.key")]
            p, out = attack(tmp_path, port, "hello", "--ca", str(fed / "ca.pem"), *mine)
            assert p.wait(60) == 0, out.read_text()
            answers[name] = attack_lines(out)[-1]
    finally:
        server.kill()
    assert answers["alice"]["code"] == "OK"
    assert answers["eve"]["code"] == "UNAVAILABLE", answers["eve"]
    # no call of eve's reached the server's handlers
    assert not [e for e in server.events() if "eve" in str(e.get("sender"))]


class _Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


def test_backoff_pauses_double_to_a_cap_each_jittered() -> None:
    """0.2 s doubling to 5 s, each drawn within half to one and a half times it."""
    b = Backoff()
    nominal = [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    pauses = [b.pause() for _ in nominal]
    assert all(n / 2 <= p <= n * 1.5 for p, n in zip(pauses, nominal, strict=True)), pauses
    b.reset()
    assert b.pause() <= 0.3


def test_retrying_waits_out_transient_statuses_only() -> None:
    """Two RESOURCE_EXHAUSTED then an answer: answered after two pauses; a
    PERMISSION_DENIED is raised at once; a transient status past the time is raised."""
    answers: list[object] = [
        _Status(grpc.StatusCode.RESOURCE_EXHAUSTED),
        _Status(grpc.StatusCode.UNAVAILABLE),
        "hello",
    ]
    slept: list[float] = []

    def call() -> object:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert retrying(call, 60, sleep=slept.append) == "hello"
    assert len(slept) == 2 and 0.1 <= slept[0] <= 0.3 and 0.2 <= slept[1] <= 0.6
    answers[:] = [_Status(grpc.StatusCode.PERMISSION_DENIED)]
    with pytest.raises(grpc.RpcError):
        retrying(call, 60, sleep=slept.append)
    assert len(slept) == 2
    answers[:] = [_Status(grpc.StatusCode.UNAVAILABLE)]
    with pytest.raises(grpc.RpcError):
        retrying(call, 0.0, sleep=slept.append)  # no time to wait


@pytest.mark.slow
def test_a_client_without_a_server_gives_up_after_give_up_s(tmp_path: Path) -> None:
    """Retries count toward --give-up-s: with nothing listening, the process
    retries with backoff and exits 1 about 3 s after its first failure (not
    after a minute of retries per call on top)."""

    port = free_port()  # free, and nothing listens there once closed
    client = start_client(tmp_path, port, "0-2", "--insecure", "--give-up-s", "3")
    assert client.wait(90) == 1, client.log.read_text()
    events = client.events()
    retries = [e for e in events if e.get("event") == "retry"]
    assert retries and all(e["code"] == "UNAVAILABLE" for e in retries)
    gave_up = next(e for e in events if e.get("event") == "gave_up")
    # 3 s of retries, one pause of the reconnection's backoff (0.3 s at most), one try
    assert 3 <= gave_up["t"] - retries[0]["t"] <= 5.5, (retries[0], gave_up)


def _in_process(tmp: Path, **deployment: Any) -> Deployment:
    """An insecure server in this process (its counts can be read), with these
    ``deployment`` settings."""

    cfg = _served(config_mod.load(write_config(tmp / "cfg.yaml", deployment=deployment)))
    dep = Deployment(cfg, ServerOptions(ServerSecurity("insecure"), port=0))
    dep.start()
    return dep


def test_one_connection_holds_at_most_its_streams(tmp_path: Path) -> None:
    """100 idle calls on one connection (an address allowed 128 waiting): the
    server lets 64 streams open (HTTP/2's max_concurrent_streams), the others
    wait in the client."""

    dep = _in_process(tmp_path, pending_per_address=128, pending_calls=128)
    channel = grpc.insecure_channel(f"127.0.0.1:{dep.port}")
    stop = threading.Event()

    def never() -> Iterator[pb.Signed]:
        stop.wait()
        yield from ()

    hello = channel.stream_unary(
        "/fedforge.v1.Federation/Hello",
        request_serializer=pb.Signed.SerializeToString,
        response_deserializer=pb.HelloReply.FromString,
    )
    try:
        calls = [hello.future(never(), timeout=20) for _ in range(100)]
        time.sleep(1.5)  # within the request wait: none cut yet
        waiting = sum(dep.admission.pending.values())
    finally:
        stop.set()
        for c in calls:
            c.cancel()
        channel.close()
        dep.stop("done")
    assert waiting == STREAMS_PER_CONNECTION == 64


@pytest.mark.slow
def test_one_name_holds_at_most_its_share_of_calls(tmp_path: Path) -> None:
    """A joined name's long-polls beyond CALLS_PER_NAME are told RESOURCE_EXHAUSTED
    at once (the rest wait for work, as polls do); another name is still served."""

    dep = _in_process(tmp_path)
    channel = grpc.insecure_channel(f"127.0.0.1:{dep.port}")
    stub = pb_grpc.FederationStub(channel)

    def signed(name: str, body: bytes) -> pb.Signed:
        return pb.Signed(auth=pb.Auth(client=name), body=body)

    try:
        join = pb.JoinRequest(members=[pb.Member(client_id=0, num_examples=10)])
        session = stub.Join(signed("greedy", join.SerializeToString()), timeout=10).session
        poll = pb.PollRequest(session=session, wait_s=4).SerializeToString()
        extra = 4
        with ThreadPoolExecutor(CALLS_PER_NAME + extra) as pool:
            calls = [
                pool.submit(stub.Poll.with_call, signed("greedy", poll), timeout=20)
                for _ in range(CALLS_PER_NAME + extra)
            ]
            t0 = time.monotonic()
            hello = stub.Hello(signed("other", b""), timeout=10)
            assert hello.run_name == "dep" and time.monotonic() - t0 < 2
            codes = []
            for f in calls:
                try:
                    f.result()
                    codes.append("OK")
                except grpc.RpcError as exc:
                    codes.append(exc.code().name)
    finally:
        channel.close()
        dep.stop("done")
    assert codes.count("RESOURCE_EXHAUSTED") == extra, codes
    assert codes.count("OK") == CALLS_PER_NAME, codes

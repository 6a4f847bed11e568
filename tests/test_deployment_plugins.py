"""A deployment's plugins over the wire, with real server and client processes
on loopback: the server names the plugins its run uses and their versions in
Hello; a client process without one, or with another version, refuses to join
in one line naming it and both versions; an older client that says no plugins
in Join is refused by the server, which goes on and counts none of them; and a
config naming what no one registered is refused when the server starts."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from deploy_procs import Proc, start_client, start_server, write_config
from fedforge.core import registry
from fedforge.core.plugin_versions import identify
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc
from test_plugins import PLUGIN


def _digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _error_line(proc: Proc) -> str:
    [line] = [ln for ln in proc.log.read_text().splitlines() if ln.startswith("fedforge: error:")]
    return line


def _signed(body: bytes) -> pb.Signed:
    return pb.Signed(auth=pb.Auth(client="old-client"), body=body)


def test_a_client_needs_the_runs_plugin_in_the_same_version(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "a" / "wire_prox.py", tmp_path / "b" / "wire_prox.py"
    for path, tail in ((ours, ""), (theirs, "# edited since\n")):
        path.parent.mkdir()
        path.write_text(PLUGIN.replace("NAME", "wire_prox") + tail)
    version, other = _digest(ours), _digest(theirs)
    assert version != other
    cfg = write_config(tmp_path / "cfg.yaml", algorithm="wire_prox", rounds=1)
    server, port = start_server(tmp_path, cfg, "--insecure", "--plugin", str(ours))
    try:
        missing = start_client(tmp_path, port, "0-2", "--insecure")
        edited = start_client(tmp_path, port, "3-5", "--insecure", "--plugin", str(theirs))
        assert missing.wait(60) == 2 and edited.wait(60) == 2
        assert _error_line(missing) == (
            "fedforge: error: the run uses plugin 'wire_prox.py' (algorithm 'wire_prox') "
            f"version {version}; this client has not loaded it: start it with --plugin "
            "FILE_OR_MODULE (the same version)"
        )
        assert _error_line(edited) == (
            "fedforge: error: plugin 'wire_prox.py' (algorithm 'wire_prox') is version "
            f"{version} on the server and {other} on this client: run the same plugin on both "
            "sides"
        )

        # a client of a fedforge before plugin checks: its Join says no plugins
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.FederationStub(channel)
            hello = stub.Hello(_signed(pb.HelloRequest().SerializeToString()), timeout=30)
            said = [(p.name, p.version, p.provides) for p in hello.plugins]
            assert said == [("wire_prox.py", version, "algorithm 'wire_prox'")]
            join = pb.JoinRequest(members=[pb.Member(client_id=0, num_examples=10)])
            with pytest.raises(grpc.RpcError) as refused:
                stub.Join(_signed(join.SerializeToString()), timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == (
            f"the run uses plugin 'wire_prox.py' (algorithm 'wire_prox') version {version}; "
            "the joining client process did not say it has it (a fedforge client that says "
            "no plugins in Join is older than plugin checks: update it)"
        )
        time.sleep(1.5)  # a join is said within a second (transport/joins.py)
        assert server.popen.poll() is None
        joining = [e["joined"] for e in server.events() if e.get("event") == "joining"]
        assert joining and set(joining) == {0}  # none of the refused counted as joined
        assert any(
            e.get("event") == "refused" and "did not say it has it" in e.get("reason", "")
            for e in server.events()
        )

        good = [
            start_client(tmp_path, port, ids, "--insecure", "--plugin", str(ours))
            for ids in ("0-2", "3-5")
        ]
        assert server.wait(180) == 0, server.log.read_text()
        for client in good:
            assert client.wait(60) == 0, client.log.read_text()
        [joined] = [e["clients"] for e in server.events() if e.get("event") == "clients_joined"]
        assert joined == 6
    finally:
        server.kill()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"model": "nobody_registered"}, "model 'nobody_registered' is unknown"),
        ({"algorithm": "nobody_registered"}, "config field 'algorithm' = 'nobody_registered'"),
        ({"plugin_options": {"fedprox": {"mu": 1}}}, "config field 'plugin_options.fedprox'"),
    ],
    ids=["model", "algorithm", "options"],
)
def test_a_server_config_naming_what_no_one_registered_is_refused_at_start(
    tmp_path: Path, fields: dict[str, object], named: str
) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", **fields)
    done = subprocess.run(
        [sys.executable, "-m", "fedforge.cli", "server", "--config", str(cfg), "--insecure"]
        + ["--port", "0", "--runs-dir", str(tmp_path / "runs"), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("fedforge: error:")]
    assert len(errors) == 1 and named in errors[0], done.stderr
    assert '"listening"' not in done.stdout  # refused before it listened


def test_a_module_plugin_is_named_by_its_module_and_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "versioned_plugin_mod.py").write_text('__version__ = "2.5.1"\n')
    (tmp_path / "plain_plugin_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("versioned_plugin_mod", "plain_plugin_mod"):
        registry.load_plugin(name)
    versioned = identify("versioned_plugin_mod")
    plain = identify("plain_plugin_mod")
    assert (versioned.name, versioned.version) == ("versioned_plugin_mod", "2.5.1")
    assert (plain.name, plain.version) == (
        "plain_plugin_mod",
        _digest(tmp_path / "plain_plugin_mod.py"),
    )

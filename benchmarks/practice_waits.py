"""How long a Join waits while many long polls wait at the deployment server.

    python benchmarks/practice_waits.py                  # 0, 100, 300, 600 polls
    python benchmarks/practice_waits.py --waiting 0 300 --wait-s 20

A ``fedforge`` deployment server in this process (insecure, on loopback, the
hub's pool of ``serve.MAX_WORKERS`` threads), and names that each join with a
client id and keep 15 long polls of ``--wait-s`` seconds open. With that many
polls waiting (opened after every waiting name joined), five more names join one
after the other; their Join latency is the figure (a Join takes the hub's lock
on the pool: queued behind waits that hold the pool's threads, it waits until
they end).

Figures, per count of waiting polls: join_p50_ms, join_max_ms. The last line is
``RESULT waiting=N:p50/max ...`` (ms).

    python benchmarks/practice_waits.py --sigterm 3

With ``--sigterm K``: K times, a ``fedforge server`` process and two ``fedforge
client`` processes (loopback, insecure, a long run of quick rounds: logistic
regression on the synthetic data), SIGTERM to the server 3 s
after the clients joined; the figure is the seconds from the signal to the
server's exit (sigterm_exit_s: each, and the largest).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from fedforge import config as config_mod
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc
from fedforge.transport.security import ServerSecurity
from fedforge.transport.serve import Deployment, ServerOptions, _served

PER_NAME = 15  # polls of one name (admission.CALLS_PER_NAME is 16)


def signed(name: str, body: bytes) -> pb.Signed:
    return pb.Signed(auth=pb.Auth(client=name), body=body)


def join(stub: Any, name: str, cid: int) -> str:
    body = pb.JoinRequest(members=[pb.Member(client_id=cid, num_examples=10)])
    return str(stub.Join(signed(name, body.SerializeToString()), timeout=120).session)


def measure(waiting: int, wait_s: float, tmp: Path) -> dict[str, float]:
    names = -(-waiting // PER_NAME)
    cfg_file = tmp / f"cfg-{waiting}.yaml"
    cfg_file.write_text(yaml.safe_dump({"name": "waits", "num_clients": names + 10}))
    cfg = _served(config_mod.load(cfg_file))
    dep = Deployment(cfg, ServerOptions(ServerSecurity("insecure"), port=0))
    dep.start()
    target = f"127.0.0.1:{dep.port}"
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection each (64 streams at most)
    channels = [grpc.insecure_channel(target, options=own) for _ in range(names + 1)]
    try:
        stubs = [pb_grpc.FederationStub(ch) for ch in channels]
        sessions = [join(stubs[i], f"waiter-{i}", i) for i in range(names)]  # first: no poll yet
        polls = []
        for i, session in enumerate(sessions):
            body = pb.PollRequest(session=session, wait_s=wait_s).SerializeToString()
            n = min(PER_NAME, waiting - i * PER_NAME)
            polls += [
                stubs[i].Poll.future(signed(f"waiter-{i}", body), timeout=wait_s + 60)
                for _ in range(n)
            ]
        time.sleep(2.0)  # every poll is open and waiting
        stub = stubs[-1]
        took = []
        for k in range(5):
            t0 = time.perf_counter()
            join(stub, f"late-{k}", names + k)
            took.append((time.perf_counter() - t0) * 1000)
        dep.hub.finish("measured")
        for p in polls:
            p.result(timeout=wait_s + 60)
    finally:
        for ch in channels:
            ch.close()
        dep.stop("measured", dismiss=False)
    return {"join_p50_ms": statistics.median(took), "join_max_ms": max(took)}


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def _until_event(log: Path, event: str, timeout_s: float = 120) -> dict[str, Any]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for e in _events(log):
            if e.get("event") == event:
                return e
        time.sleep(0.1)
    raise SystemExit(f"no {event} in {log}:\n{log.read_text()[-2000:]}")


def sigterm_exit(tmp: Path) -> float:
    """Seconds from SIGTERM to a serving server's exit, its clients polling."""
    cfg = tmp / "run.yaml"
    run = {"name": "stop", "dataset": "synthetic", "model": "logreg", "num_clients": 6}
    run |= {"rounds": 500, "batch_size": 10, "lr": 0.05, "local_epochs": 1}
    run |= {"client_fraction": 0.5, "dtype": "float64", "target_accuracy": None}
    run |= {"robust": {"max_refused_fraction": None}}  # (never stop on refusals)
    cfg.write_text(yaml.safe_dump(run))
    fedforge = [sys.executable, "-m", "fedforge.cli"]
    logs = [tmp / f"{k}-{time.monotonic_ns()}.log" for k in ("server", "c0", "c1")]
    server_cmd = [*fedforge, "server", "--insecure", "--port", "0", "-q", "--config", str(cfg)]
    server_cmd += ["--runs-dir", str(tmp / "runs")]
    procs = [subprocess.Popen(server_cmd, stdout=logs[0].open("wb"), stderr=subprocess.STDOUT)]
    try:
        port = _until_event(logs[0], "listening")["port"]
        for ids, log in zip(("0-2", "3-5"), logs[1:], strict=True):
            cmd = [*fedforge, "client", "--server", f"127.0.0.1:{port}", "--insecure"]
            cmd += ["--clients", ids]
            procs.append(subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT))
        _until_event(logs[0], "clients_joined")
        time.sleep(3.0)
        t0 = time.perf_counter()
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait(120)
        return time.perf_counter() - t0
    finally:
        for p in procs:
            p.kill()
            p.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--waiting", type=int, nargs="+", default=[0, 100, 300, 600])
    p.add_argument("--wait-s", type=float, default=20.0)
    p.add_argument("--sigterm", type=int, default=0, help="measure a signal stop K times")
    args = p.parse_args(argv)
    if args.sigterm:
        with tempfile.TemporaryDirectory() as d:
            took = [sigterm_exit(Path(d)) for _ in range(args.sigterm)]
        print("RESULT sigterm_exit_s=" + ",".join(f"{t:.2f}" for t in took), f"max={max(took):.2f}")
        return 0
    out = []
    with tempfile.TemporaryDirectory() as d:
        for n in args.waiting:
            got = measure(n, args.wait_s, Path(d))
            print(f"waiting={n} {got}", flush=True)
            out.append(f"waiting={n}:{got['join_p50_ms']:.0f}/{got['join_max_ms']:.0f}")
    print("RESULT " + " ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

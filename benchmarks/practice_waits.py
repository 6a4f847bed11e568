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
"""

from __future__ import annotations

import argparse
import statistics
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--waiting", type=int, nargs="+", default=[0, 100, 300, 600])
    p.add_argument("--wait-s", type=float, default=20.0)
    args = p.parse_args(argv)
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

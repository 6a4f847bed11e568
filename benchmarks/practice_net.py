"""How long idle calls from a peer without credentials block an honest client.

    python benchmarks/practice_net.py            # 250 idle calls held 20 s
    python benchmarks/practice_net.py --calls 250 --hold-s 20

Real processes on loopback: a ``fedforge server`` (keys mode: every request
signed by a registered Ed25519 key) and the attack client of the tests
(``tests/attack_client.py idle``: ``--calls`` calls that open and never send
their request, each opened again as soon as the server ends it, from a peer
with no key, on IPv6 loopback: another address than the honest side's, which
calls over IPv4, since the calls of one address waiting for their request are
capped, ``deployment.pending_per_address``). The honest side is this process:
every 0.2 s it makes a signed Hello (a registered key), as a client process
joining would, first for 3 s without the attack (the baseline latency), then
while the attack holds.

Figures:
- idle_call_block_s: the seconds of the attack during which an honest call was
  not answered within 1 s (each probe that failed or took longer counts until
  the next probe); target 0.
- honest_call_p50_ms / honest_call_max_ms: the honest Hello's latency under the
  attack (baseline_p50_ms: without it).
- server_rss_mib: the server's resident memory while it holds the idle calls.

``measure()`` returns them; the last line is ``RESULT k=v ...``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from _common import result_line
from fedforge.transport.auth import Signer, generate_identity, load_identity, register_key
from fedforge.transport.certs import write_federation
from fedforge.transport.members import write_members
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
ATTACK = ROOT / "tests" / "attack_client.py"
FEDFORGE = [sys.executable, "-m", "fedforge.cli"]
PROBE_EVERY_S = 0.2
ANSWERED_WITHIN_S = 1.0

CONFIG = {
    "name": "net",
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 6,
    "rounds": 1,
    "deployment": {"start_timeout_s": 600},
}


def _server(tmp: Path, fed: Path) -> tuple[subprocess.Popen[bytes], Path, int]:
    cfg = tmp / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    log = tmp / "server.log"
    cmd = [*FEDFORGE, "server", "--config", str(cfg), "--port", "0", "--host", "localhost", "-q"]
    cmd += ["--runs-dir", str(tmp / "runs"), "--certs", str(fed), "--auth", "keys"]
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=tmp)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        for line in log.read_text(errors="replace").splitlines():
            if '"listening"' in line:
                return proc, log, int(json.loads(line)["port"])
        if proc.poll() is not None:
            raise SystemExit(f"the server exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    raise SystemExit(f"the server did not listen:\n{log.read_text()}")


def _probe(
    stub: pb_grpc.FederationStub, signer: Signer, seconds: float
) -> list[tuple[bool, float]]:
    """Signed Hellos every PROBE_EVERY_S for ``seconds``: (answered in time, latency)."""
    body = pb.HelloRequest().SerializeToString()
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        e = signer.sign("Hello", body)
        auth = pb.Auth(
            client=e.client_name, nonce=e.nonce, timestamp=e.timestamp, signature=e.signature
        )
        t0 = time.monotonic()
        try:
            stub.Hello(pb.Signed(auth=auth, body=body), timeout=2 * ANSWERED_WITHIN_S)
            ok = True
        except grpc.RpcError:
            ok = False
        took = time.monotonic() - t0
        out.append((ok and took <= ANSWERED_WITHIN_S, took))
        time.sleep(max(0.0, PROBE_EVERY_S - took))
    return out


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(calls: int = 250, hold_s: float = 20.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="practice-net-") as d:
        tmp = Path(d)
        fed = tmp / "fed"
        write_federation(fed, [], ("localhost", "127.0.0.1"))
        register_key(fed / "keys.json", "honest", generate_identity(tmp / "honest.key"))
        write_members(fed / "members.json", {"honest": [0]})
        signer = Signer("honest", load_identity(tmp / "honest.key"))
        server, log, port = _server(tmp, fed)
        creds = grpc.ssl_channel_credentials((fed / "ca.pem").read_bytes())
        channel = grpc.secure_channel(f"127.0.0.1:{port}", creds)
        stub = pb_grpc.FederationStub(channel)
        attack = None
        try:
            baseline = _probe(stub, signer, 3.0)
            cmd = [sys.executable, str(ATTACK), "idle", "--target", f"[::1]:{port}"]
            cmd += ["--calls", str(calls), "--hold-s", str(hold_s), "--ca", str(fed / "ca.pem")]
            cmd += ["--tls-name", "localhost"]
            attack = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            assert attack.stdout is not None
            assert "holding" in attack.stdout.readline()
            t0 = time.monotonic()
            under = _probe(stub, signer, hold_s - 2.0)
            rss = _rss_mib(server.pid)
            ended = json.loads(attack.stdout.read().strip().splitlines()[-1])
            attack.wait(60)
        finally:
            channel.close()
            if attack is not None and attack.poll() is None:
                attack.kill()
            server.kill()
            server.wait(30)
        steps = [PROBE_EVERY_S if took <= PROBE_EVERY_S else took for _, took in under]
        blocked = sum(s for (ok, _), s in zip(under, steps, strict=True) if not ok)
        lat = [took * 1000 for _, took in under]
        return {
            "idle_call_block_s": round(float(min(blocked, time.monotonic() - t0)), 2),
            "honest_call_p50_ms": round(statistics.median(lat), 1),
            "honest_call_max_ms": round(max(lat), 1),
            "baseline_p50_ms": round(statistics.median(t * 1000 for _, t in baseline), 1),
            "honest_calls": len(under),
            "honest_calls_refused": sum(1 for ok, _ in under if not ok),
            "server_rss_mib": round(rss, 1),
            "attack_calls_opened": ended.get("opened"),
            "attack_calls_ended": ended.get("ended"),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=250)
    ap.add_argument("--hold-s", type=float, default=20.0)
    args = ap.parse_args()
    out = measure(args.calls, args.hold_s)
    print(json.dumps(out, indent=1))
    print(result_line({k: v for k, v in out.items() if isinstance(v, (int, float))}))


if __name__ == "__main__":
    main()

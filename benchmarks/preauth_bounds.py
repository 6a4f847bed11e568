"""A deployment server's bounds before authentication: the log lines and bytes
it writes for a flood of forged Hellos (keys mode, random signatures for a
registered name), the refusals its metric counts, and the most memory calls
waiting for their request may hold (``admission.py``: calls times the largest
message read before the sender is known), from the default config.

    python benchmarks/preauth_bounds.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import math
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from deploy_procs import start_server, write_config  # noqa: E402
from fedforge.config.deployment import DeploymentConfig  # noqa: E402
from fedforge.transport import admission  # noqa: E402
from test_deployment_hostile import keys_federation  # noqa: E402

ATTACK = Path(__file__).resolve().parent.parent / "tests" / "attack_client.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory_mib() -> tuple[float, float]:
    """The most that calls waiting for their request may hold, MiB: from one
    address, and in all (inf: no cap in all, as in a version without
    ``deployment.pending_calls``, whose cap per address is the module's)."""
    dep = DeploymentConfig()
    each = (max(admission.REQUEST_MIB << 20, dep.chunk_kib * 1024) + (64 << 10)) / (1 << 20)
    per_address = getattr(dep, "pending_per_address", admission.PENDING_PER_ADDRESS)
    return per_address * each, getattr(dep, "pending_calls", math.inf) * each


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="preauth-"))
    fed = keys_federation(tmp)
    metrics = _free_port()
    server, port = start_server(
        tmp,
        write_config(tmp / "cfg.yaml"),
        *("--certs", str(fed), "--auth", "keys", "--metrics-port", str(metrics)),
    )
    try:
        before = server.log.stat().st_size
        cmd = [sys.executable, str(ATTACK), "forged", "--target", f"127.0.0.1:{port}"]
        cmd += ["--calls", str(args.calls), "--name", "alice", "--ca", str(fed / "ca.pem")]
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        seconds = time.monotonic() - t0
        time.sleep(11.0)  # the log's window (10 s) closes: its count is said
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read()
        counted = re.search(rb'fedforge_refused_total\{reason="unauthenticated"\} (\S+)', text)
    finally:
        server.kill()
    log = server.log.read_text()[before:]
    lines = sum('"refused"' in line for line in log.splitlines())
    per_address, total = memory_mib()
    print(
        f"RESULT calls={args.calls} seconds={seconds:.1f} log_lines={lines} "
        f"log_bytes={server.log.stat().st_size - before} "
        f"metric={float(counted.group(1)) if counted else 0:.0f} "
        f"pending_mib_per_address={per_address:.0f} pending_mib_total={total:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

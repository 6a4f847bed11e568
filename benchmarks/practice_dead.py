"""Dead clients and honest bytes, with real processes on loopback (mutual TLS):
``--procs`` client processes host two clients each, a tenth of the processes is
killed by SIGKILL once ``--kill-after`` rounds are recorded, and the run goes on.

    python benchmarks/practice_dead.py            # 10 processes, 20 clients, 2 runs
    python benchmarks/practice_dead.py --repeats 1

Figures (the worst over ``--repeats`` runs):
- bytes_recorded_vs_sent: the run store's bytes (the rounds' ``bytes_up`` +
  ``bytes_down``) over the bytes the server sent and took (its wire counters:
  a model counted when its download was streamed to the end, an update when
  taken), as logged at the end of the run (target 1.00).
- dead_client_detect_s: seconds from the SIGKILL to the killed process's ids
  leaving the server's live set (``connected`` in its live-state file, which it
  rewrites within 0.25 s of a change), the clients' default heartbeat (2 s) and
  the default 30 s heartbeat timeout (target < 5).

Last line: ``RESULT bytes_recorded_vs_sent=... dead_client_detect_s=...``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from deploy_lab import Lab, LabError, check_import, split
from fedforge.cli import main as fedforge_main
from fedforge.store.live_state import read_live_state

CONFIG: dict[str, Any] = {
    "name": "practice-dead",
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 20,
    "client_fraction": 0.5,
    "rounds": 12,
    "local_epochs": 1,
    "batch_size": 10,
    "lr": 0.05,
    "target_accuracy": None,
    "checkpoint_every": 1,
    "deployment": {"start_timeout_s": 300},
}


def _rounds(runs: Path) -> int:
    for db in runs.glob("[!.]*/store.sqlite"):
        with (
            contextlib.suppress(sqlite3.OperationalError),
            sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn,
        ):
            return int(conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])
    return 0


def _connected(runs: Path) -> set[int] | None:
    for path in runs.glob("[!.]*/live.json"):
        state = read_live_state(path.parent)
        if state is not None:
            return set(state["connected"])
    return None


def one_run(lab: Lab, root: Path, procs: int, kill_after: int, k: int) -> dict[str, Any]:
    """One run with a tenth of ``procs`` killed: its two figures and the details."""
    runs = root / f"runs-{k}"
    cfg = root / f"cfg-{k}.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "num_clients": 2 * procs}))
    server, port = lab.server(cfg, runs)
    groups = split(list(range(2 * procs)), procs)
    clients = lab.clients(port, groups, heartbeat_s=2.0, exit_at={})
    end = time.monotonic() + 300
    while _rounds(runs) < kill_after:
        if time.monotonic() > end or server.poll() is not None:
            raise LabError(f"no round {kill_after} within 300 s\n{server.tail()}")
        time.sleep(0.02)
    doomed = list(range(0, procs, 10))  # a tenth of the processes
    dead = {c for i in doomed for c in groups[i]}
    killed = time.monotonic()
    for i in doomed:
        clients[i].expect_exit = True
        clients[i].kill(signal.SIGKILL)
    detect_s = None
    while time.monotonic() - killed < 60:
        live = _connected(runs)
        if live is not None and not dead & live:
            detect_s = time.monotonic() - killed
            break
        time.sleep(0.01)
    server.wait(600, clients)
    finished = server.event("finished")
    assert finished is not None, server.tail()
    db = next(runs.glob("[!.]*/store.sqlite"))
    with sqlite3.connect(db) as conn:
        up, down = conn.execute("SELECT SUM(bytes_up), SUM(bytes_down) FROM rounds").fetchone()
        rounds = conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]
    sent = finished["wire_bytes_up"] + finished["wire_bytes_down"]
    return {
        "bytes_recorded": up + down,
        "bytes_sent": sent,
        "ratio": (up + down) / sent,
        "detect_s": detect_s,
        "killed_ids": sorted(dead),
        "rounds": rounds,
        "killed_after_round": kill_after,
    }


def measure(procs: int = 10, repeats: int = 2, kill_after: int = 3) -> dict[str, Any]:
    """The two figures (the worst run's) and each run's details."""
    root = Path(tempfile.mkdtemp(prefix="practice-dead-"))
    with contextlib.redirect_stdout(io.StringIO()):
        fedforge_main(["certs", "--out", str(root / "certs"), "--clients", f"0-{procs - 1}"])
    (root / "certs" / "members.json").unlink()  # the lab's server takes --any-member
    lab = Lab(root, root / "certs")
    runs = []
    try:
        for k in range(repeats):
            runs.append(one_run(lab, root, procs, kill_after + k, k))
            lab.close()
    finally:
        lab.close()
        shutil.rmtree(root, ignore_errors=True)
    detects = [r["detect_s"] for r in runs]
    return {
        "bytes_recorded_vs_sent": max(runs, key=lambda r: abs(r["ratio"] - 1))["ratio"],
        "dead_client_detect_s": None if None in detects else max(detects),
        "runs": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=10, help="client processes (two clients each)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kill-after", type=int, default=3, help="rounds recorded before the kill")
    args = ap.parse_args()
    print(f"fedforge in the processes: {check_import()}", flush=True)
    got = measure(args.procs, args.repeats, args.kill_after)
    print(json.dumps(got, indent=2), flush=True)
    ratio, detect = got["bytes_recorded_vs_sent"], got["dead_client_detect_s"]
    detect_text = "none" if detect is None else f"{detect:.2f}"
    print(f"RESULT bytes_recorded_vs_sent={ratio:.4f} dead_client_detect_s={detect_text}")


if __name__ == "__main__":
    sys.exit(main())

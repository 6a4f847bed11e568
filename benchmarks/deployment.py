"""The gRPC deployment against the simulator, on the same cores: 100 clients hosted
in a few ``fedforge client`` processes (mutual TLS, loopback) served by a
``fedforge server``, and the same config run by ``fedforge run``.

    python benchmarks/deployment.py               # the full measurement (MNIST CNN)
    python benchmarks/deployment.py --quick       # smoke: synthetic logreg, 20 clients

Figures (each deployment: ``deployment.start_clients`` = every client, mutual TLS):
- deploy_vs_sim_cnn: the deployment's mean round time over the simulator's, for
  each ``--fractions`` C (MNIST CNN IID, E=1 B=10, ``--procs`` client processes;
  a round's time is the ``seconds`` column of the run store's ``rounds``, rounds
  2 on: round 1 holds the cold start, the simulator's pool start). The simulator
  runs the same config file and seed once per ``--sim-workers`` layout (engine
  auto; 0: one worker process per core, 1: in one process); the faster layout is
  the reference. The figure is the worst C; each C's is in the JSON.
- deploy_equiv_maxdiff: max |deployed - simulated| of the final parameters of a
  float64 run (MNIST 2NN, C=0.1, 2 rounds; the simulator on its serial engine).
- server_rss_mib_100 / sim_rss_mib_100: peak RSS (ru_maxrss when reaped) of the
  server process with its clients connected (the largest over the C's), and of
  the simulator in one process (workers 1) on the same config.
- secagg_deploy_overhead: round 2's time with secure aggregation over round 2's
  time without it, both over the wire with ``--secagg-procs`` processes, both
  clipped at 1.0; in the secure run one process hosting ``--drop`` of round 2's
  cohort exits when handed its ``--drop-phase`` (FEDFORGE_TEST_EXIT_AT), so the
  round includes detecting them (``--heartbeat-timeout``) and recovering.
- server_rss_mib_100_remote: the same with ``deployment.client_data: remote``
  (part ``remote``: benchmarks/deploy_own_data.py), beside model_mib.
- resume_after_kill_s: SIGKILL to the server once ``--kill-after`` rounds are
  recorded (checkpoint every round), then ``fedforge server --resume RUN --port
  SAME``: seconds from that command to the next round's row in the store (the
  start, the clients' reconnection with backoff, the cold start of every client
  again, one round: the parts are in the JSON).

The JSON goes to benchmarks/results/deployment/ (``--quick``: benchmarks/out/).
Last line: ``RESULT deploy_vs_sim_cnn=... deploy_equiv_maxdiff=... ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from _common import machine
from deploy_lab import (
    Lab,
    LabError,
    Proc,
    check_import,
    drop_layout,
    mean_round,
    merged,
    mib,
    participants,
    query,
    round_seconds,
    split,
    store_file,
    summary,
    wait_rows,
)
from deploy_own_data import own_data
from fedforge.cli import main as fedforge_main
from fedforge.selection.sampling import sample_cohort
from fedforge.store.checkpoint import CHECKPOINTS_DIR, checkpoint_name
from fedforge.store.final import load_final

ROOT = Path(__file__).resolve().parent.parent
QUICK = {"name": "quick", "dataset": "synthetic", "model": "logreg", "batch_size": 10, "lr": 0.05}


class Bench:
    def __init__(self, args: argparse.Namespace, lab: Lab, configs: dict[str, Any]) -> None:
        self.args, self.lab, self.configs = args, lab, configs
        self.n = args.clients

    def config(self, name: str, row: str, **changes: Any) -> Path:
        """``configs/<row>.yaml`` (``--quick``: synthetic logreg) with ``changes``,
        every client needed to start, and the benchmark's waiting rules."""
        a = self.args
        base = QUICK if a.quick else yaml.safe_load((ROOT / "configs" / f"{row}.yaml").read_text())
        common: dict[str, Any] = {
            "name": name,
            "num_clients": self.n,
            "target_accuracy": None,
            "deployment": {
                "start_clients": self.n,
                "start_timeout_s": 600,
                "round_deadline_s": 900,
                "heartbeat_timeout_s": a.heartbeat_timeout,
            },
        }
        if a.threads is not None:  # the server's and simulator's (the clients keep 1)
            common["threads"] = a.threads
        if a.eval_every is not None:
            common["evaluation"] = {"every": a.eval_every}
        cfg = self.configs[name] = merged(merged(base, common), changes)
        path = self.lab.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def deploy(
        self,
        name: str,
        cfg: Path,
        groups: list[list[int]],
        exit_at: dict[int, str] | None = None,
        data: Path | None = None,
    ) -> tuple[Path, Proc]:
        """Run ``cfg`` deployed, client process k hosting ``groups[k]`` (``data``:
        with their own examples, ``data/<id>/``): its store."""
        runs = self.lab.root / name
        t0 = time.perf_counter()
        server, port = self.lab.server(cfg, runs)
        clients = self.lab.clients(port, groups, self.args.heartbeat_s, exit_at or {}, data)
        code = server.wait(self.args.timeout, clients)
        if code != 0:
            raise LabError(f"{name}: the server exited {code}\n{server.tail()}")
        for c in clients:
            want = 1 if c.expect_exit else 0
            if c.wait(120) != want or (c.expect_exit and c.event("test_exit") is None):
                raise LabError(f"{name}: {c.name} exited {c.poll()}, not {want}\n{c.tail()}")
        db = store_file(runs)
        assert db is not None
        print(f"  {name}: deployed in {time.perf_counter() - t0:.0f} s", flush=True)
        return db, server

    def simulate(self, name: str, cfg: Path, **sets: Any) -> tuple[Path, Proc]:
        """Run ``cfg`` with ``fedforge run`` in a process of its own: its store."""
        runs = self.lab.root / name
        args = ["run", "--config", str(cfg), "--runs-dir", str(runs), "-q"]
        for k, v in sets.items():
            args += ["--set", f"{k}={v}"]
        t0 = time.perf_counter()
        proc = self.lab.start(name, args)
        if proc.wait(self.args.timeout) != 0:
            raise LabError(f"{name}: fedforge run exited {proc.poll()}\n{proc.tail()}")
        db = store_file(runs)
        assert db is not None
        print(f"  {name}: simulated in {time.perf_counter() - t0:.0f} s", flush=True)
        return db, proc


def cnn_vs_sim(b: Bench, out: dict[str, Any]) -> None:
    a, n = b.args, b.n
    groups = split(list(range(n)), a.procs)
    fractions = [float(f) for f in a.fractions.split(",")]
    rounds = [int(r) for r in a.rounds.split(",")]
    rounds += [rounds[-1]] * (len(fractions) - len(rounds))
    for frac, nr in zip(fractions, rounds, strict=False):
        tag = f"c{round(frac * 100)}"
        cfg = b.config(f"cnn_{tag}", "cnn_iid_e1_b10", client_fraction=frac, rounds=nr)
        print(f"C={frac:g}: {nr} rounds, {n} clients in {len(groups)} processes", flush=True)
        db, server = b.deploy(f"deploy_{tag}", cfg, groups)
        rec: dict[str, Any] = {
            "rounds": nr,
            "deploy_round_s": mean_round(db),
            "deploy_rounds_s": round_seconds(db),
            "server_rss_mib": mib(server.maxrss_kib),
            "wire": {k: v for k, v in (server.event("finished") or {}).items() if "bytes" in k},
            "sim": {},
        }
        for w in [int(x) for x in a.sim_workers.split(",")]:
            sdb, sim = b.simulate(f"sim_{tag}_w{w}", cfg, workers=w)
            notes = [ln for ln in sim.log.read_text().splitlines() if ln.startswith("fedforge:")]
            rec["sim"][f"workers{w}"] = {
                "engine": summary(sdb).get("engine"),
                "round_s": mean_round(sdb),
                "rounds_s": round_seconds(sdb),
                "rss_mib": mib(sim.maxrss_kib),
                "same_participants": participants(sdb) == participants(db),
                "notes": notes,
            }
        best = min(rec["sim"].items(), key=lambda kv: kv[1]["round_s"])
        rec["sim_reference"] = best[0]
        rec["ratio"] = rec["deploy_round_s"] / best[1]["round_s"]
        one = rec["sim"].get("workers1", best[1])
        rec["sim_rss_mib"] = one["rss_mib"]
        for w, s in rec["sim"].items():
            print(
                f"  sim {w} ({s['engine']}): {s['round_s']:.2f} s/round, "
                f"peak RSS {s['rss_mib']:.0f} MiB, same cohorts {s['same_participants']}"
            )
        print(
            f"  deployment: {rec['deploy_round_s']:.2f} s/round (x{rec['ratio']:.2f} the "
            f"simulator's {best[0]}), server peak RSS {rec['server_rss_mib']:.0f} MiB",
            flush=True,
        )
        out["cnn"][tag] = rec


def equivalence(b: Bench, out: dict[str, Any]) -> None:
    cfg = b.config("equiv", "2nn_iid_e1_b10", dtype="float64", rounds=2, client_fraction=0.1)
    print("float64 equivalence (2NN; quick: logreg)", flush=True)
    db, _ = b.deploy("deploy_equiv", cfg, split(list(range(b.n)), b.args.procs))
    sdb, _ = b.simulate("sim_equiv", cfg, engine="serial", workers=1)
    got, want = load_final(db.parent)["params"], load_final(sdb.parent)["params"]
    diff = float((got - want).abs().max())
    same = participants(db) == participants(sdb)
    print(f"  max |deployed - simulated| = {diff:.3g} (same cohorts {same})", flush=True)
    out["equiv"] = {"maxdiff": diff, "dtype": str(got.dtype), "same_participants": same}


def secagg(b: Bench, out: dict[str, Any]) -> None:
    a, n = b.args, b.n
    procs = min(a.secagg_procs, n)
    cohort = sample_cohort(n, a.secagg_fraction, 0, 1)  # round 2's (the configs' seed 0)
    k = max(1, round(a.drop * len(cohort)))
    groups = drop_layout(n, procs, cohort, k)
    common: dict[str, Any] = {"client_fraction": a.secagg_fraction, "rounds": 2}
    common["communication"] = {"clip_norm": 1.0}
    common["deployment"] = {"cold_start": False}  # refused with secure aggregation
    plain_cfg = b.config("plain", "cnn_iid_e1_b10", **common)
    secure_cfg = b.config("secagg", "cnn_iid_e1_b10", privacy={"secagg": True}, **common)
    print(
        f"secure aggregation: C={a.secagg_fraction:g}, {len(groups)} processes, {k} of round "
        f"2's {len(cohort)} clients exit at {a.drop_phase}",
        flush=True,
    )
    pdb, _ = b.deploy("deploy_plain", plain_cfg, groups)
    sdb, _ = b.deploy("deploy_secagg", secure_cfg, groups, {0: f"1:{a.drop_phase}"})
    plain, secure = round_seconds(pdb)[1], round_seconds(sdb)[1]
    got = participants(sdb).get(1, 0)
    print(f"  round 2: plain {plain:.2f} s, secure {secure:.2f} s ({got} clients in the sum)")
    out["secagg"] = {
        "plain_round_s": plain,
        "secure_round_s": secure,
        "ratio": secure / plain,
        "cohort": len(cohort),
        "dropped": k,
        "drop_phase": a.drop_phase,
        "in_sum": got,
        "skips": query(sdb, "SELECT round_idx, reason FROM anomalies WHERE client_id IS NULL"),
    }


def resume(b: Bench, out: dict[str, Any]) -> None:
    a, lab, n = b.args, b.lab, b.n
    rounds = a.kill_after + 2
    cfg = b.config("resume", "cnn_iid_e1_b10", rounds=rounds, checkpoint_every=1)
    print(f"server SIGKILL after {a.kill_after} rounds, then --resume", flush=True)
    runs = lab.root / "deploy_resume"
    server, port = lab.server(cfg, runs)
    clients = lab.clients(port, split(list(range(n)), a.procs), a.heartbeat_s, {})
    count = "SELECT COUNT(*) FROM rounds"
    wait_rows(runs, server, count, lambda r: r[0][0] >= a.kill_after, a.timeout)
    db = store_file(runs)
    assert db is not None
    ckpt = db.parent / CHECKPOINTS_DIR / checkpoint_name(a.kill_after) / "meta.json"
    wait_rows(runs, server, count, lambda _: ckpt.is_file(), a.timeout)  # mid-round then
    server.kill()
    at_kill = query(db, count)[0][0]
    t0 = time.time()
    again, _ = lab.server(None, runs, port=port, resume=db.parent)
    sql = f"SELECT round_idx, created, seconds FROM rounds WHERE created > {t0} ORDER BY created"
    first = wait_rows(runs, again, sql, bool, a.timeout)[0]
    took = first[1] - t0
    if again.wait(a.timeout, clients) != 0 or any(c.wait(120) for c in clients):
        raise LabError("the resumed run failed\n" + "\n".join(p.tail() for p in lab.procs))
    status = query(db, "SELECT status FROM runs")[0][0]
    done = query(db, count)[0][0]
    parts = {e: (again.event(e) or {}).get("t") for e in ("listening", "clients_joined")}
    rec = {
        "seconds": took,
        "rounds_at_kill": at_kill,
        "next_round": first[0] + 1,
        "next_round_s": first[2],
        **{f"{e}_s": (t - t0 if t else None) for e, t in parts.items()},
        "status": status,
        "rounds_done": done,
    }
    print(
        f"  round {first[0] + 1} recorded {took:.1f} s after the restart (listening "
        f"{rec['listening_s']:.1f} s, all joined {rec['clients_joined_s']:.1f} s, round "
        f"{first[2]:.1f} s); run {status} with {done}/{rounds} rounds",
        flush=True,
    )
    out["resume"] = rec


PARTS = dict(cnn=cnn_vs_sim, remote=own_data, equiv=equivalence, secagg=secagg, resume=resume)


def figures(out: dict[str, Any]) -> dict[str, float | None]:
    cnn = list(out["cnn"].values())
    worst = max(cnn, key=lambda r: r["ratio"], default=None)
    big = max(cnn, key=lambda r: r["server_rss_mib"] or 0, default=None)
    fields = {
        "deploy_vs_sim_cnn": worst["ratio"] if worst else None,
        "deploy_equiv_maxdiff": out.get("equiv", {}).get("maxdiff"),
        "server_rss_mib_100": big["server_rss_mib"] if big else None,
        "sim_rss_mib_100": big["sim_rss_mib"] if big else None,
        "secagg_deploy_overhead": out.get("secagg", {}).get("ratio"),
        "resume_after_kill_s": out.get("resume", {}).get("seconds"),
        **{f"deploy_vs_sim_cnn_{tag}": r["ratio"] for tag, r in out["cnn"].items()},
    }
    if big and big["server_rss_mib"] and big["sim_rss_mib"]:
        fields["server_over_sim_rss"] = big["server_rss_mib"] / big["sim_rss_mib"]
    remote = [r for r in out.get("remote", {}).values() if r["server_rss_mib"]]
    if remote:
        top = max(remote, key=lambda r: r["server_rss_mib"])
        fields["server_rss_mib_100_remote"] = top["server_rss_mib"]
        fields["model_mib"] = top["model_mib"]
        if big and big["sim_rss_mib"]:
            fields["server_remote_over_sim_rss"] = top["server_rss_mib"] / big["sim_rss_mib"]
    return fields


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="20 clients, 2 processes, 2 rounds")
    p.add_argument("--parts", default=",".join(PARTS), help="which figures: " + ",".join(PARTS))
    p.add_argument("--clients", type=int, help="num_clients (default 100; quick: 20)")
    p.add_argument("--procs", type=int, default=4, help="client processes (cnn, equiv, resume)")
    p.add_argument("--fractions", default="0.1,1.0")
    p.add_argument("--rounds", default="5,2", help="rounds per fraction (round 1 not timed)")
    p.add_argument("--sim-workers", default="0,1", help="the simulator's layouts (workers)")
    p.add_argument("--threads", type=int, help="torch threads of server and simulator")
    p.add_argument("--eval-every", type=int, help="override the config's evaluation.every")
    p.add_argument("--secagg-procs", type=int, default=10)
    p.add_argument("--secagg-fraction", type=float, default=1.0)
    p.add_argument("--drop", type=float, default=0.1, help="of round 2's cohort")
    p.add_argument("--drop-phase", default="unmask", help="advertise .. unmask, or train")
    p.add_argument("--kill-after", type=int, default=2, help="rounds recorded before SIGKILL")
    p.add_argument("--heartbeat-s", type=float, default=1.0, help="the clients' heartbeat")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0, help="silent: a dropout")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per process, at most")
    p.add_argument("--data-dir", help="where the data sets are (else $FEDFORGE_DATA)")
    p.add_argument("--out", type=Path, help="the JSON (default: results/deployment/)")
    p.add_argument("--keep", action="store_true", help="keep the run stores and logs")
    args = p.parse_args(argv)
    if args.quick:
        args.procs, args.secagg_procs = 2, 5
        args.fractions, args.rounds, args.kill_after = "0.1,1.0", "2", 1
        args.timeout = min(args.timeout, 600)
    args.clients = args.clients or (20 if args.quick else 100)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # unwind: the processes are killed
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    if args.data_dir:
        os.environ["FEDFORGE_DATA"] = args.data_dir
    root = Path(tempfile.mkdtemp(prefix="deployment-"))
    print(f"fedforge in the processes: {check_import()}; work folder {root}", flush=True)
    before = machine()
    procs = max(args.procs, args.secagg_procs)
    with contextlib.redirect_stdout(io.StringIO()):
        fedforge_main(["certs", "--out", str(root / "certs"), "--clients", f"0-{procs - 1}"])
    (root / "certs" / "members.json").unlink()  # each part lays its ids out: --any-member
    lab = Lab(root, root / "certs")
    out: dict[str, Any] = {"cnn": {}}
    configs: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        for part in args.parts.split(","):
            PARTS[part](Bench(args, lab, configs), out)
    except LabError as exc:
        print(f"deployment benchmark failed (logs kept in {root}):\n{exc}", file=sys.stderr)
        return 1
    finally:
        lab.close()
    fields = figures(out)
    record = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {**before, "loadavg_end": os.getloadavg()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "seconds": time.perf_counter() - t0,
        "figures": fields,
        **out,
        "configs": configs,
    }
    dest = args.out or ROOT / "benchmarks" / ("out" if args.quick else "results") / "deployment"
    path = dest if dest.suffix == ".json" else dest / "deployment.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"wrote {path} ({record['seconds']:.0f} s; load average at the start {before['loadavg']})"
    )
    print(
        "RESULT " + " ".join(f"{k}={math.nan if v is None else v:.4g}" for k, v in fields.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

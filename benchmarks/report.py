"""The HTML report of a long run: ``fedforge report`` on a run store of 1,000
rounds and 1,000 clients, built synthetically through the run store's own
writers (no training), then reported.

    python benchmarks/report.py            # 1,000 rounds, 1,000 clients, cohort 100
    python benchmarks/report.py --quick    # 100 rounds, 200 clients, cohort 20

The store: every round a cohort of ``--cohort`` clients drawn at random
(``client_rounds``: examples, train loss, update norm, bytes), test accuracy and
loss every ``--eval-every`` rounds, per-client evaluation of every client on the
same rounds (``client_eval``), drift diagnostics every round, epsilon every
round (``privacy``, DP central with a budget), about 2% of the uploads refused
(``anomalies``, a few reasons, a few clients more often) and a skipped round
now and then, per-group accuracy of two attributes on the evaluation rounds
(``group_eval``), and a few model versions. The build is not timed.

Figures: report_s, the seconds from opening the store to the page written
(gathering, figures, HTML; the median of ``--repeat``); report_mib, the file's
size (plotly.js, 4.6 MiB of it, included).

The JSON goes to benchmarks/results/report/ (``--quick``: benchmarks/out/).
Last line: ``RESULT report_s=... report_mib=...``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import ROOT, machine, result_line
from fedforge.config import from_dict
from fedforge.report.html import write_report
from fedforge.store import AnomalyRecord, ClientRecord, RoundRecord, RunStore
from fedforge.store.versions import add_version

REASONS = (
    "delta holds non-finite values (NaN or inf)",
    "update norm {x:.4g} is an outlier (robust z = {z:.1f} > 3.5; cohort median norm 1.02)",
    "num_examples {n} must be an integer in [1, 2^53]",
)
GROUP_EVAL = """CREATE TABLE IF NOT EXISTS group_eval (round_idx INTEGER, attribute TEXT,
    group_name TEXT, accuracy REAL, loss REAL, num_examples INTEGER, clients INTEGER)"""
PARAMS = 199_210  # MNIST 2NN: what the bytes stand for


def _round_rows(
    r: int, args: argparse.Namespace, rng: np.random.Generator, examples: np.ndarray
) -> tuple[RoundRecord, list[ClientRecord], list[AnomalyRecord], tuple[float, ...]]:
    """Round ``r``: its row, its cohort's rows, its refusals and its diagnostics."""
    n, k, dense = args.clients, args.cohort, PARAMS * 4
    acc = 0.97 - 0.87 * np.exp(-r / (args.rounds / 8))
    cohort = np.sort(rng.choice(n, size=k, replace=False))
    norms = rng.lognormal(0.0, 0.3, size=k) * (1 + 3 * np.exp(-r / 50))
    loss = float(1.2 - acc)
    clients = [
        ClientRecord(r, int(c), int(examples[c]), loss + rng.normal(0, 0.05), x, dense // 4, dense)
        for c, x in zip(cohort.tolist(), norms.tolist(), strict=True)
    ]
    refused = []
    for c, x in zip(cohort.tolist(), norms.tolist(), strict=True):
        if rng.random() < 0.02 + 0.2 * (c % 97 == 0):  # a few clients refused often
            why = REASONS[int(rng.integers(len(REASONS)))]
            refused.append(AnomalyRecord(r, c, why.format(x=x * 9, z=rng.uniform(4, 9), n=0)))
    if r % 97 == 96:
        refused.append(AnomalyRecord(r, None, "too few updates: 1 of 100 accepted"))
    evaluated = r % args.eval_every == args.eval_every - 1 or r == args.rounds - 1
    row = RoundRecord(
        round_idx=r,
        cohort_size=k,
        train_loss=loss,
        test_accuracy=float(acc) if evaluated else None,
        test_loss=float(1.1 - acc) if evaluated else None,
        bytes_up=k * dense // 4,  # 8-bit quantised up, float32 down
        bytes_down=k * dense,
        paper_bytes=2 * PARAMS * k * 4,
        lr=0.1,
        seconds=float(rng.uniform(0.8, 1.4)),
        float32_up=k * dense,
        float32_down=k * dense,
    )
    median = float(np.median(norms))
    cosine = float(0.3 * np.exp(-r / 200) + rng.normal(0, 0.01))
    diagnostics = (r, k, cosine, median, float(norms.max()), float(norms.max()) / median)
    return row, clients, refused, diagnostics


def build_store(runs: Path, args: argparse.Namespace) -> Path:
    """A finished run of ``args.rounds`` rounds written row by row, as a run would."""
    rng = np.random.default_rng(0)
    n = args.clients
    cfg = from_dict(
        {
            "name": "bench-report",
            "num_clients": n,
            "client_fraction": args.cohort / n,
            "rounds": args.rounds,
            "evaluation": {"clients": True},
            "privacy": {"dp": "central", "noise_multiplier": 1.0, "target_epsilon": 50.0},
        }
    )
    examples = rng.integers(20, 600, size=n)
    skill = rng.normal(0.0, 0.05, size=n)  # each client's accuracy offset
    with RunStore.create(runs, cfg) as store:
        # the build is not what is measured: no fsync per transaction (a run's
        # durability guarantee), else 1,000 rounds of 3-4 transactions take minutes
        store._conn.execute("PRAGMA synchronous = OFF")
        for r in range(args.rounds):
            row, clients, refused, diagnostics = _round_rows(r, args, rng, examples)
            store.record_round(row, clients, refused)
            store.record_rows("diagnostics", r, [diagnostics])
            store.record_privacy(r, 0.3 * (r + 1) ** 0.5, 1e-5, 1.0)
            if row.test_accuracy is not None:
                accs = np.clip(row.test_accuracy + skill + rng.normal(0, 0.02, size=n), 0, 1)
                evals = [(r, c, a, 1.1 - a, int(examples[c] // 5)) for c, a in enumerate(accs)]
                store.record_rows("client_eval", r, evals)
            if r in (args.rounds // 4, args.rounds // 2, args.rounds - 1):
                accuracy = 1.2 - row.train_loss  # the curve the losses were drawn from
                add_version(store, torch.zeros(16), r, metrics={"accuracy": accuracy})
        store.finish({"rounds_done": args.rounds, "wall_seconds": float(args.rounds)})
        path = store.path
    with sqlite3.connect(path / "store.sqlite") as conn:  # per-group rows: another feature's
        conn.execute(GROUP_EVAL)
        rows = [
            (r, attribute, f"{attribute}-{g}", 0.9 - 0.05 * g + 0.0001 * r, 0.3, 1000, n // 5)
            for r in range(args.eval_every - 1, args.rounds, args.eval_every)
            for attribute in ("region", "device")
            for g in range(5)
        ]
        conn.executemany("INSERT INTO group_eval VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="100 rounds, 200 clients, cohort 20")
    p.add_argument("--rounds", type=int, help="default 1000 (quick: 100)")
    p.add_argument("--clients", type=int, help="default 1000 (quick: 200)")
    p.add_argument("--cohort", type=int, help="clients a round (default 100; quick: 20)")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3, help="reports timed (the median is the figure)")
    p.add_argument("--out", type=Path, help="the JSON (default: results/report/)")
    p.add_argument("--keep", action="store_true", help="keep the run store and the page")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (100 if args.quick else 1000)
    args.clients = args.clients or (200 if args.quick else 1000)
    args.cohort = args.cohort or (20 if args.quick else 100)
    root = Path(tempfile.mkdtemp(prefix="report-bench-"))
    before = machine()
    t0 = time.perf_counter()
    run_dir = build_store(root / "runs", args)
    build_s = time.perf_counter() - t0
    print(f"built {run_dir} in {build_s:.0f} s", flush=True)
    page = root / "report.html"
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        write_report(run_dir, page)
        times.append(time.perf_counter() - t)
    fields = {
        "report_s": statistics.median(times),
        "report_mib": page.stat().st_size / 2**20,
    }
    record = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": before,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "build_seconds": build_s,
        "report_seconds": times,
        "store_mib": (run_dir / "store.sqlite").stat().st_size / 2**20,
        "figures": fields,
    }
    dest = args.out or ROOT / "benchmarks" / ("out" if args.quick else "results") / "report"
    path = dest if dest.suffix == ".json" else dest / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    if args.keep:
        print(f"kept {run_dir} and {page}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    print(f"wrote {path}; reports took {', '.join(f'{t:.2f}' for t in times)} s")
    print(result_line(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())

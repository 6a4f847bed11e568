"""Robustness benchmark (issue 5): aggregator speed on [K, P], then the
attack x aggregator x attacker-fraction matrix on MNIST.

Part 1 times every aggregator on a random ``[K, P]`` cohort (K = 100 clients,
P = 1.66M parameters, the CNN's size; --quick: K = 20, P = 200k), in
interleaved blocks (A B C ... A B C ...), and reports the median seconds.

Part 2 runs the 2NN on 100 clients (IID and Dirichlet(0.5)), cohort 20
(C = 0.2), for every attack x aggregator x attacker fraction {0.1, 0.2, 0.3},
plus each aggregator's clean run (fraction 0), and records the final accuracy
and the rounds to the target (best-so-far curve, interpolated). Each finished
cell is saved as one JSON file under ``--out`` (the full run:
benchmarks/results/robustness, tracked) and reused on a rerun, so the matrix can
be split over processes (``--partitions iid`` beside ``--partitions dirichlet``)
and a stopped run loses at most one cell; the tables and the RESULT line are
printed from every cell found. ``--model cnn`` with ``--aggregators``,
``--attacks`` and ``--fractions`` runs spot checks (saved beside, keyed by model). Attackers are
round(fraction x 100) clients drawn from the seed; Krum/Multi-Krum assume
f = 6 (30% of the cohort), Bulyan f = 4 (the most 4f + 3 <= 20 allows),
trimmed mean beta = 0.3. The drop of a cell is the clean accuracy of the same
aggregator minus the cell's (points). Runs are interleaved by nothing: each is
deterministic (derived randomness), so only wall time drifts.

Prints one table per partition, writes a CSV, and as its last line
``RESULT <agg>_drop20=... <agg>_drop20_alie=... <agg>_drop20_ipm=... <agg>_seconds=...``
where ``drop20`` is the largest drop at 20% attackers over the simple attacks
(label flip, sign flip, scaled, Gaussian, NaN/Inf, uint8), and ``fedavg`` is
the weighted mean.

    OMP_NUM_THREADS=1 python benchmarks/robustness.py --quick     # smoke, minutes
    OMP_NUM_THREADS=1 python benchmarks/robustness.py             # the full matrix
    OMP_NUM_THREADS=1 python benchmarks/robustness.py --partitions iid &      # the same,
    OMP_NUM_THREADS=1 python benchmarks/robustness.py --partitions dirichlet  # on 2 cores
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import get_args

import torch

from _common import save_record
from fedforge.config import AggregatorName, Config, EvaluationConfig, PartitionConfig, RobustConfig
from fedforge.data.federated import load_federated_data
from fedforge.evaluation.metrics import rounds_to_target
from fedforge.robust.parts import make_aggregator
from fedforge.server.loop import run

ROOT = Path(__file__).resolve().parent.parent

AGGREGATORS = list(get_args(AggregatorName))  # every aggregator the config offers
SIMPLE = ["label_flip", "sign_flip", "scaled", "gaussian", "nan_inf", "uint8"]
COLLUDING = ["alie", "ipm"]
FRACTIONS = [0.1, 0.2, 0.3]


def agg_params(agg: str, cohort: int) -> dict[str, object]:
    """Krum/Multi-Krum assume f = 30% of the cohort (as far as 2f + 3 <= K allows),
    Bulyan as far as 4f + 3 <= K allows; trimmed mean beta = 0.3."""
    f30 = int(0.3 * cohort)
    return {
        "trimmed_mean": {"trim_fraction": 0.3},
        "krum": {"byzantine": min(f30, (cohort - 3) // 2)},
        "multi_krum": {"byzantine": min(f30, (cohort - 3) // 2)},
        "bulyan": {"byzantine": min(f30, (cohort - 3) // 4)},
    }.get(agg, {})


def label(agg: str) -> str:
    return "fedavg" if agg == "mean" else agg


def time_aggregators(k: int, p: int, repeats: int, cohort: int) -> dict[str, float]:
    """Median seconds of each aggregator on one random [k, p] float32 cohort."""
    gen = torch.Generator().manual_seed(0)
    updates = torch.randn(k, p, generator=gen)
    weights = torch.ones(k, dtype=torch.float64)
    rules = {
        a: make_aggregator(RobustConfig(aggregator=a, **agg_params(a, cohort))) for a in AGGREGATORS
    }
    times: dict[str, list[float]] = {a: [] for a in AGGREGATORS}
    for _ in range(repeats):  # interleaved: one of each per block
        for name, rule in rules.items():
            t0 = time.perf_counter()
            rule.aggregate(updates, weights)
            times[name].append(time.perf_counter() - t0)
    return {a: statistics.median(t) for a, t in times.items()}


def cell_name(model: str, part: str, agg: str, attack: str, fraction: float) -> str:
    return f"{model}__{part}__{label(agg)}__{attack}__{round(100 * fraction)}"


def run_cell(cfg: Config, data: object, target: float) -> dict[str, object]:
    """One matrix cell, condensed: final accuracy, rounds to target, refusals."""
    t0 = time.perf_counter()
    result = run(cfg, data=data, progress=False, store=False)  # type: ignore[arg-type]
    evals = [
        (r.round_idx + 1, r.test_accuracy) for r in result.rounds if r.test_accuracy is not None
    ]
    accs = [float(a) for _, a in evals]
    rtt = rounds_to_target([r for r, _ in evals], accs, target)
    return {
        "final_accuracy": accs[-1],
        "rounds_to_target": rtt,
        "rejected": len(result.rejected),
        "skipped": len(result.skipped),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def timing(args: argparse.Namespace, quick: bool, cohort: int) -> dict[str, float]:
    """Part 1, or its saved figures (``timing.json`` under --out) when present."""
    path = args.out / "timing.json"
    if path.is_file() and not args.timing_only:
        saved: dict[str, float] = json.loads(path.read_text())["seconds"]
        print(f"aggregator seconds: reusing {path}")
        return saved
    k, p, repeats = (20, 200_000, 1) if quick else (100, 1_663_370, 3)
    speed = time_aggregators(k, p, repeats, cohort)
    threads = torch.get_num_threads()
    print(f"aggregator seconds on [{k}, {p}] float32, {threads} thread(s) (median of {repeats})")
    for a, s in speed.items():
        print(f"  {label(a):<17} {s:8.3f}")
    path.write_text(json.dumps({"k": k, "p": p, "threads": threads, "seconds": speed}))
    return speed


def print_tables(rows: list[dict[str, object]], model: str) -> dict[tuple[str, str], float]:
    """One table per partition (cells missing from the records print as '-');
    returns the clean accuracy of each (partition, aggregator)."""
    rows = [r for r in rows if r["model"] == model]
    clean = {
        (str(r["partition"]), str(r["aggregator"])): float(r["final_accuracy"])  # type: ignore[arg-type]
        for r in rows
        if r["attack"] == "none"
    }
    index = {(r["partition"], r["aggregator"], r["attack"], r["fraction"]): r for r in rows}
    attacks = SIMPLE + COLLUDING
    for part in sorted({str(r["partition"]) for r in rows}):
        print(f"\n{model} {part}: final accuracy (clean run, then each attack at 10/20/30%)")
        print(f"{'aggregator':<17} {'clean':>6} " + " ".join(f"{a:>20}" for a in attacks))
        for agg in AGGREGATORS:
            name = label(agg)
            if (part, name) not in clean:
                continue
            cells = []
            for atk in attacks:
                accs = [index.get((part, name, atk, f)) for f in FRACTIONS]
                cells.append(
                    "/".join(
                        "  -  " if r is None else f"{float(r['final_accuracy']):.3f}" for r in accs
                    )
                )
            print(f"{name:<17} {clean[(part, name)]:6.3f} " + " ".join(f"{c:>20}" for c in cells))
    return clean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny smoke version")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--out", type=Path, default=None, help="records (default: tracked results)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the timing")
    ap.add_argument("--timing-only", action="store_true", help="part 1 only")
    ap.add_argument("--model", default="2nn", choices=["2nn", "cnn"])
    ap.add_argument("--partitions", default=None, help="comma-separated: iid,dirichlet")
    ap.add_argument("--aggregators", default=None, help="comma-separated subset")
    ap.add_argument("--attacks", default=None, help="comma-separated subset")
    ap.add_argument("--fractions", default=None, help="comma-separated subset of 0.1,0.2,0.3")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    quick = args.quick
    if args.out is None:
        args.out = ROOT / "benchmarks" / ("out/robustness" if quick else "results/robustness")
    args.out.mkdir(parents=True, exist_ok=True)

    def pick(given: str | None, default: list[str]) -> list[str]:
        return default if given is None else given.split(",")

    if quick:
        aggs, attacks, fractions = ["mean", "median", "krum"], ["sign_flip", "uint8", "alie"], [0.2]
        partitions, rounds, clients, frac = ["iid"], args.rounds or 2, 20, 0.5
    else:
        aggs, attacks = pick(args.aggregators, AGGREGATORS), pick(args.attacks, SIMPLE + COLLUDING)
        fractions = [float(f) for f in pick(args.fractions, [str(f) for f in FRACTIONS])]
        partitions = pick(args.partitions, ["iid", "dirichlet"])
        rounds, clients, frac = args.rounds or 20, 100, 0.2
    speed = timing(args, quick, int(clients * frac))
    if args.timing_only:
        print("RESULT " + " ".join(f"{label(a)}_s={s:.3f}" for a, s in speed.items()))
        return
    torch.set_num_threads(1)

    base = Config(
        name="robustness",
        model=args.model,
        data_dir=args.data_dir,
        num_clients=clients,
        client_fraction=frac,
        local_epochs=1,
        batch_size=10,
        lr=0.05,
        rounds=rounds,
        target_accuracy=None,
        evaluation=EvaluationConfig(every=1),
        engine="auto",  # vectorised for the 2NN, serial for the CNN
        runs_dir=str(args.out / "runs"),
        checkpoint_every=0,
    )
    cells_dir = args.out / "cells"
    cells_dir.mkdir(exist_ok=True)
    for part in partitions:
        cfg_p = dataclasses.replace(base, partition=PartitionConfig(kind=part, alpha=0.5))
        data = None
        cells = [(a, "none", 0.0) for a in aggs]
        cells += [(a, atk, f) for f in fractions for atk in attacks for a in aggs]
        for agg, attack, fraction in cells:
            path = cells_dir / (cell_name(args.model, part, agg, attack, fraction) + ".json")
            if path.is_file():
                continue
            robust = RobustConfig(
                aggregator=agg,
                attack=attack,
                attack_fraction=fraction,
                **agg_params(agg, int(clients * frac)),
            )
            if data is None:
                data = load_federated_data(cfg_p)
            row = {"model": args.model, "partition": part, "aggregator": label(agg)}
            row |= {"attack": attack, "fraction": fraction, "rounds": rounds}
            row |= run_cell(dataclasses.replace(cfg_p, robust=robust), data, args.target)
            save_record(path, row)
            rtt = row["rounds_to_target"]
            print(
                f"{part:<9} {label(agg):<17} {attack:<10} {fraction:4.2f} "
                f"acc {row['final_accuracy']:.4f} rtt {rtt if rtt is None else round(rtt, 1)} "  # type: ignore[arg-type]
                f"rejected {row['rejected']} ({row['seconds']} s)",
                flush=True,
            )

    rows = [json.loads(p.read_text()) for p in sorted(cells_dir.glob("*.json"))]
    rows = [r for r in rows if r["rounds"] == rounds and r["model"] == args.model]
    csv_path = args.out / (
        "robustness.csv" if args.model == "2nn" else f"robustness-{args.model}.csv"
    )
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    clean = print_tables(rows, args.model)
    print(f"\nCSV: {csv_path}")

    result_parts = []
    for agg in AGGREGATORS:
        name = label(agg)

        def drop(kinds: list[str], name: str = name) -> float | None:
            d = [
                100 * (clean[(r["partition"], name)] - float(r["final_accuracy"]))
                for r in rows
                if r["model"] == args.model
                and r["aggregator"] == name
                and r["attack"] in kinds
                and r["fraction"] == 0.2
                and (r["partition"], name) in clean
            ]
            return round(max(d), 2) if d else None

        if any(r["aggregator"] == name and r["model"] == args.model for r in rows):
            result_parts.append(f"{name}_drop20={drop(SIMPLE)}")
            result_parts.append(f"{name}_drop20_alie={drop(['alie'])}")
            result_parts.append(f"{name}_drop20_ipm={drop(['ipm'])}")
            result_parts.append(f"{name}_seconds={speed[agg]:.3f}")
    print("RESULT " + " ".join(result_parts))


if __name__ == "__main__":
    main()

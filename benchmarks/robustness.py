"""Robustness benchmark (issue 5): aggregator speed on [K, P], then the
attack x aggregator x attacker-fraction matrix on MNIST.

Part 1 times every aggregator on a random ``[K, P]`` cohort (K = 100 clients,
P = 1.66M parameters, the CNN's size; --quick: K = 20, P = 200k), in
interleaved blocks (A B C ... A B C ...), and reports the median seconds.

Part 2 runs the 2NN on 100 clients (IID and Dirichlet(0.5)), cohort 20
(C = 0.2), for every attack x aggregator x attacker fraction {0.1, 0.2, 0.3},
plus each aggregator's clean run (fraction 0), and records the final accuracy
and the rounds to the target (best-so-far curve, interpolated). Attackers are
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
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from fedforge.config import Config, PartitionConfig, RobustConfig
from fedforge.experiment import load_federated_data
from fedforge.metrics import rounds_to_target
from fedforge.robust import make_aggregator
from fedforge.server.loop import run

AGGREGATORS = [
    "mean",
    "median",
    "trimmed_mean",
    "krum",
    "multi_krum",
    "bulyan",
    "geometric_median",
    "norm_bound",
    "centred_clip",
]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny smoke version")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/robustness"))
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the timing")
    ap.add_argument("--timing-only", action="store_true", help="part 1 only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.quick:
        k, p, repeats = 20, 200_000, 1
        aggs, attacks, fractions = ["mean", "median", "krum"], ["sign_flip", "uint8", "alie"], [0.2]
        partitions, rounds, clients, frac = ["iid"], args.rounds or 2, 20, 0.5
    else:
        k, p, repeats = 100, 1_663_370, 3
        aggs, attacks, fractions = AGGREGATORS, SIMPLE + COLLUDING, FRACTIONS
        partitions, rounds, clients, frac = ["iid", "dirichlet"], args.rounds or 20, 100, 0.2

    speed = time_aggregators(k, p, repeats, int(clients * frac))
    threads = torch.get_num_threads()
    print(f"aggregator seconds on [{k}, {p}] float32, {threads} thread(s) (median of {repeats})")
    for a, s in speed.items():
        print(f"  {label(a):<17} {s:8.3f}")
    if args.timing_only:
        print("RESULT " + " ".join(f"{a}_s={s:.3f}" for a, s in speed.items()))
        return
    torch.set_num_threads(1)

    args.out.mkdir(parents=True, exist_ok=True)
    base = Config(
        name="robustness",
        model="2nn",
        data_dir=args.data_dir,
        num_clients=clients,
        client_fraction=frac,
        local_epochs=1,
        batch_size=10,
        lr=0.05,
        rounds=rounds,
        target_accuracy=None,
        eval_every=1,
        engine="vectorized",
        runs_dir=str(args.out / "runs"),
        checkpoint_every=0,
    )
    rows: list[dict[str, object]] = []
    data_cache = {}
    for part in partitions:
        cfg_p = dataclasses.replace(base, partition=PartitionConfig(kind=part, alpha=0.5))
        data_cache[part] = load_federated_data(cfg_p)
        cells = [(a, "none", 0.0) for a in aggs]
        cells += [(a, atk, f) for f in fractions for atk in attacks for a in aggs]
        for agg, attack, fraction in cells:
            robust = RobustConfig(
                aggregator=agg,
                attack=attack,
                attack_fraction=fraction,
                **agg_params(agg, int(clients * frac)),
            )
            cfg = dataclasses.replace(cfg_p, robust=robust)
            t0 = time.perf_counter()
            result = run(cfg, data=data_cache[part], progress=False, store=False)
            evals = [
                (r.round_idx + 1, r.test_accuracy)
                for r in result.rounds
                if r.test_accuracy is not None
            ]
            accs = [a for _, a in evals]
            rtt = rounds_to_target([r for r, _ in evals], accs, args.target)
            rows.append(
                {
                    "partition": part,
                    "aggregator": label(agg),
                    "attack": attack,
                    "fraction": fraction,
                    "final_accuracy": accs[-1],
                    "rounds_to_target": rtt,
                    "rejected": len(result.rejected),
                    "skipped": len(result.skipped),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(
                f"{part:<9} {label(agg):<17} {attack:<10} {fraction:4.2f} "
                f"acc {accs[-1]:.4f} rtt {rtt if rtt is None else round(rtt, 1)} "
                f"rejected {len(result.rejected)} ({rows[-1]['seconds']} s)",
                flush=True,
            )
    csv_path = args.out / ("robustness-quick.csv" if args.quick else "robustness.csv")
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    clean = {
        (r["partition"], r["aggregator"]): float(r["final_accuracy"])
        for r in rows
        if r["attack"] == "none"
    }
    for part in partitions:
        print(f"\n{part}: final accuracy (drop from the same aggregator's clean run, points)")
        head = ["aggregator", "clean"] + [f"{a}@{f:.0%}" for f in fractions for a in attacks]
        print("  ".join(f"{h:>14}" for h in head))
        for agg in aggs:
            cells = [label(agg), f"{clean[(part, label(agg))]:.4f}"]
            for f in fractions:
                for atk in attacks:
                    (r,) = [
                        x
                        for x in rows
                        if x["partition"] == part
                        and x["aggregator"] == label(agg)
                        and x["attack"] == atk
                        and x["fraction"] == f
                    ]
                    cells.append(f"{float(r['final_accuracy']):.3f}")
            print("  ".join(f"{c:>14}" for c in cells))
    print(f"\nCSV: {csv_path}")

    result_parts = []
    at = 0.2 if 0.2 in fractions else fractions[0]
    for agg in aggs:
        name = label(agg)

        def drop(kinds: list[str], name: str = name) -> float | None:
            d = [
                100 * (clean[(str(r["partition"]), name)] - float(r["final_accuracy"]))
                for r in rows
                if r["aggregator"] == name and r["attack"] in kinds and r["fraction"] == at
            ]
            return round(max(d), 2) if d else None

        result_parts.append(f"{name}_drop20={drop(SIMPLE)}")
        result_parts.append(f"{name}_drop20_alie={drop(['alie'])}")
        result_parts.append(f"{name}_drop20_ipm={drop(['ipm'])}")
        result_parts.append(f"{name}_seconds={speed[agg]:.3f}")
    print("RESULT " + " ".join(result_parts))


if __name__ == "__main__":
    main()

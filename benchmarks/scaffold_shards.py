"""SCAFFOLD vs FedAvg vs FedProx on pathological-shard MNIST (issue 4): rounds to
97% test accuracy (2NN) / 99% (CNN). Karimireddy et al. 2020 ("SCAFFOLD:
Stochastic Controlled Averaging for Federated Learning") show SCAFFOLD needing
fewer rounds than FedAvg and FedProx when client data are heterogeneous.

Setting (McMahan et al. 2017's non-IID Table 2 rows, which this repository has
run for FedAvg): 100 clients of 2 label shards each (200 shards of 300 examples),
C = 0.1, E = 1, B = 10, client lr 0.1 for every algorithm, server lr 1;
FedProx with mu = ``--mu`` (0.01), SCAFFOLD option II (c_k from the local steps);
``--scaffold-lr``, ``--option I`` and ``--controls PATTERN`` (controls on the
matching tensors only: ``scaffold.controls``) change SCAFFOLD's arm alone (recorded under
their own names; FedAvg's and FedProx's records are reused).
Each run stops at its target or after its cap of rounds. Rounds to target are
read off the best-so-far test-accuracy curve, interpolated (fedforge.evaluation.metrics).

Full mode runs the 2NN (target 0.97, cap 1,000 rounds, evaluated every round)
and the CNN (target 0.99, cap 700 rounds, evaluated every 5) unless ``--models``
says otherwise; each run is recorded under benchmarks/results/scaffold_shards
and a rerun of the same command reuses or resumes it. ``--quick``: the 2NN only,
target 0.90, cap 40 rounds, one process.

Last line: ``RESULT scaffold_over_fedavg_rounds=<FedAvg rounds / SCAFFOLD rounds
on the first model> ...`` (above 1: SCAFFOLD needed fewer rounds), then the same
ratio and FedProx's per model (mean over seeds of the per-seed ratios; nan when a
run missed its target within the cap).

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/scaffold_shards.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

import torch

from _common import (
    add_workers,
    fmt,
    places,
    print_settings,
    ratio,
    result_line,
    run_record,
    seconds_per_round,
    workers,
)
from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data

ALGORITHMS = ("fedavg", "fedprox", "scaffold")
# model: (target, cap of rounds, evaluation.every) in full mode
FULL = {"2nn": (0.97, 1000, 1), "cnn": (0.99, 700, 5)}
QUICK = {"2nn": (0.90, 40, 1)}


def config(
    algorithm: str, model: str, seed: int, plan: tuple[float, int, int], args: Any
) -> Config:
    target, cap, every = plan
    lr = args.scaffold_lr if algorithm == "scaffold" and args.scaffold_lr else 0.1
    option = args.option if algorithm == "scaffold" else "II"
    controls = args.controls if algorithm == "scaffold" else None
    variant = (f"-lr{lr:g}" if lr != 0.1 else "") + (f"-opt{option}" if option != "II" else "")
    variant += "-controls" + re.sub(r"[^A-Za-z0-9]", "", controls) if controls else ""
    return from_dict(
        {
            "name": f"scaffold-shards-{model}-{algorithm}{variant}-s{seed}",
            "seed": seed,
            "model": model,
            "algorithm": algorithm,
            "fedprox": {"mu": args.mu if algorithm == "fedprox" else 0.0},
            "num_clients": 100,
            "partition": {"kind": "shards", "shards_per_client": 2},
            "client_fraction": 0.1,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": lr,
            "scaffold": {"option": option, "controls": controls},
            "rounds": cap,
            "target_accuracy": target,
            "evaluation": {"every": every},
            "workers": workers(args),
            "runs_dir": str(args.places.runs),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2NN to 90%%, cap 40 rounds")
    parser.add_argument("--models", default="2nn,cnn", help="full mode: 2nn, cnn or both")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--mu", type=float, default=0.01, help="FedProx's mu")
    parser.add_argument("--scaffold-lr", type=float, default=None, help="SCAFFOLD's client lr")
    parser.add_argument("--option", default="II", choices=["I", "II"], help="SCAFFOLD's c_k")
    parser.add_argument(
        "--controls",
        default=None,
        help="SCAFFOLD's controls on the tensors this regular expression matches only "
        "(e.g. '^fc3\\.'); its RESULT keys are scaffold_subset_*",
    )
    parser.add_argument(
        "--algorithms",
        default=",".join(ALGORITHMS),
        help="run only these arms (e.g. to split the work over two processes); "
        "the RESULT line needs all three",
    )
    add_workers(parser)
    args = parser.parse_args()
    chosen = args.algorithms.split(",")
    unknown = set(chosen) - set(ALGORITHMS)
    if unknown:
        parser.error(f"--algorithms: unknown {sorted(unknown)}; allowed: {', '.join(ALGORITHMS)}")
    plans = QUICK if args.quick else {m: FULL[m] for m in args.models.split(",")}
    args.places = places("scaffold_shards", args.quick)
    torch.set_num_threads(1)
    rows: list[tuple[str, int, str, dict[str, Any]]] = []
    for model, plan in plans.items():
        arms = {a: config(a, model, 0, plan, args) for a in ALGORITHMS}
        print_settings(
            f"pathological shards MNIST, {model}: target {plan[0]}", arms["fedavg"], arms
        )
        for seed in range(args.seeds):
            data = load_federated_data(config("fedavg", model, seed, plan, args))
            for algorithm in chosen:  # interleaved within a seed
                rec = run_record(config(algorithm, model, seed, plan, args), data, args.places)
                rows.append((model, seed, algorithm, rec))
                print(
                    f"{model} {algorithm} seed {seed}: rounds to target "
                    f"{fmt(rec['rounds_to_target'])} ({rec['status']})",
                    flush=True,
                )
    head = (
        f"{'model':>5} {'algorithm':>9} {'seed':>4} {'target':>6} {'rounds':>7} {'best acc':>8} "
        f"{'final acc':>9} {'done':>5} {'s/round':>7}  engine"
    )
    print(head)
    print("-" * len(head))
    for model, seed, algorithm, r in rows:
        print(
            f"{model:>5} {algorithm:>9} {seed:>4} {r['target']:>6} {fmt(r['rounds_to_target']):>7} "
            f"{fmt(r['best_accuracy'], '.4f'):>8} {fmt(r['final_accuracy'], '.4f'):>9} "
            f"{r['rounds_done']:>5} {fmt(seconds_per_round(r), '.2f'):>7}  {r['engine']}"
        )

    def paired(model: str, algorithm: str) -> float:
        got = {(m, s, a): r["rounds_to_target"] for m, s, a, r in rows}
        per_seed = [
            ratio(got[(model, s, "fedavg")], got[(model, s, algorithm)]) for s in range(args.seeds)
        ]
        return sum(per_seed) / len(per_seed) if per_seed else math.nan

    if set(chosen) != set(ALGORITHMS):
        return  # a part of the work: the command without --algorithms prints RESULT
    first = next(iter(plans))
    result: dict[str, Any] = {"scaffold_over_fedavg_rounds": paired(first, "scaffold")}
    for model in plans:
        result[f"scaffold_over_fedavg_rounds_{model}"] = paired(model, "scaffold")
        result[f"fedprox_over_fedavg_rounds_{model}"] = paired(model, "fedprox")
        for algorithm in ALGORITHMS:
            got = [r["rounds_to_target"] for m, _, a, r in rows if m == model and a == algorithm]
            result[f"{algorithm}_rounds_{model}"] = (
                sum(got) / len(got) if None not in got else math.nan
            )
    result.update(target_2nn=plans.get("2nn", (math.nan,))[0], seeds=args.seeds)
    if args.controls:  # the upload's delta c_k covers the controlled entries only
        result = {f"scaffold_subset_{k}": v for k, v in result.items()}
        result["scaffold_subset_controls"] = args.controls
    print(result_line(result))


if __name__ == "__main__":
    main()

"""FedAdam, FedYogi, FedAdagrad and FedAvgM vs FedAvg on Dirichlet(0.1) MNIST
(issue 4; Reddi et al. 2021, "Adaptive Federated Optimization", who report the
adaptive server optimizers ahead of FedAvg on heterogeneous data).

Setting: 100 clients, label skew Dirichlet(alpha = 0.1), 2NN, C = 0.1, E = 1,
B = 10, client lr 0.1 for every arm (the lr of this repository's Table 2 runs;
not tuned per arm). Server: FedAvg is SGD with server lr 1; FedAvgM is SGD with
momentum 0.9; FedAdagrad, FedAdam and FedYogi use Reddi et al.'s defaults beta1
0.9, beta2 0.99, tau 1e-3 (v starts at tau^2, no bias correction:
server/optimizers.py). Each non-FedAvg arm runs a small server-lr grid, fixed
before any run (``GRID``), and is scored by its best grid point. Every run goes
the full number of rounds (no early stop) and is evaluated every round; rounds to
the target are read off the best-so-far curve, interpolated (fedforge.evaluation.metrics).
Under Dirichlet(0.1) the accuracy curve swings from round to round, so beside the
final accuracy the table gives the mean over the last 10 evaluations ("last-10").

Full mode: 500 rounds, target 0.97, the whole grid; each run is recorded under
benchmarks/results/server_optimizers and a rerun of the same command reuses or
resumes it. ``--quick``: 25 rounds, target 0.85, the middle grid point only.
``--partition hsu``: the same alpha in Hsu et al.'s form (each client's class mix
drawn; Reddi et al.'s split), much more skewed than the default by-class split.

Last line: ``RESULT fedadam_over_fedavg_rounds=<FedAvg rounds / FedAdam's best
rounds> fedyogi_over_fedavg_rounds=...`` (above 1: fewer rounds than FedAvg; nan
when a run missed the target), the same for FedAdagrad and FedAvgM, then each
arm's best last-10 accuracy over its grid minus FedAvg's.

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data \
        python benchmarks/server_optimizers.py [--quick]
"""

from __future__ import annotations

import argparse
import math
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

# arm: (server optimizer section, server lr grid); the middle point is the quick one
GRID: dict[str, tuple[dict[str, Any], tuple[float, ...]]] = {
    "fedavg": ({"kind": "sgd"}, (1.0,)),
    "fedavgm": ({"kind": "sgd", "momentum": 0.9}, (0.1, 0.316, 1.0)),
    "fedadagrad": ({"kind": "adagrad"}, (0.01, 0.0316, 0.1)),
    "fedadam": ({"kind": "adam"}, (0.001, 0.00316, 0.01)),
    "fedyogi": ({"kind": "yogi"}, (0.001, 0.00316, 0.01)),
}
ADAPTIVE = {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
PARTITION_SUFFIX = {"dirichlet": "", "hsu": "-hsu"}  # record names (the first runs had none)


def config(arm: str, server_lr: float, seed: int, args: Any) -> Config:
    section, _ = GRID[arm]
    optimizer = {**section, **(ADAPTIVE if section["kind"] != "sgd" else {})}
    return from_dict(
        {
            "name": f"server-opt-{arm}-lr{server_lr:g}-s{seed}{PARTITION_SUFFIX[args.partition]}",
            "seed": seed,
            "model": "2nn",
            "num_clients": 100,
            "partition": {"kind": args.partition, "alpha": 0.1},
            "client_fraction": 0.1,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "server_optimizer": {**optimizer, "lr": server_lr},
            "rounds": args.rounds,
            "target_accuracy": None,  # run every round: final accuracy at a fixed budget
            "evaluation": {"every": 1},
            "workers": workers(args),
            "runs_dir": str(args.places.runs),
        }
    )


def last10(rec: dict[str, Any]) -> float:
    """The mean test accuracy over the run's last 10 evaluations."""
    accs = [a for _, a in rec["curve"][-10:]]
    return sum(accs) / len(accs)


def grid(arm: str, quick: bool) -> tuple[float, ...]:
    """The arm's server lrs, the middle one first (a run stopped part way has
    every arm's middle point before any other)."""
    lrs = GRID[arm][1]
    mid = len(lrs) // 2
    return (lrs[mid],) if quick else (lrs[mid], *lrs[:mid], *lrs[mid + 1 :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="25 rounds, one server lr an arm")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument(
        "--partition",
        choices=("dirichlet", "hsu"),
        default="dirichlet",
        help="Dirichlet(0.1) by class (NIID-Bench) or by client (Hsu et al., Reddi et al.)",
    )
    add_workers(parser)
    args = parser.parse_args()
    args.rounds, target = (25, 0.85) if args.quick else (500, 0.97)
    args.places = places("server_optimizers", args.quick)
    torch.set_num_threads(1)
    shared = config("fedavg", 1.0, 0, args)
    arms = {f"{a} lr={lr:g}": config(a, lr, 0, args) for a in GRID for lr in grid(a, args.quick)}
    print_settings(f"{args.partition} Dirichlet(0.1) MNIST, 2NN; target {target}", shared, arms)
    rows: list[tuple[int, str, float, dict[str, Any]]] = []
    width = max(len(GRID[a][1]) for a in GRID)
    for seed in range(args.seeds):
        data = load_federated_data(config("fedavg", 1.0, seed, args))
        for k in range(width):  # interleaved: every arm's k-th grid point (middle first)
            for arm in GRID:
                lrs = grid(arm, args.quick)
                if k < len(lrs):
                    rec = run_record(config(arm, lrs[k], seed, args), data, args.places, target)
                    rec["last10"] = last10(rec)
                    rows.append((seed, arm, lrs[k], rec))
                    print(
                        f"{arm} lr={lrs[k]:g} seed {seed}: rounds to {target} "
                        f"{fmt(rec['rounds_to_target'])}, final {rec['final_accuracy']:.4f} "
                        f"({rec['status']})",
                        flush=True,
                    )
    head = (
        f"{'arm':>10} {'server lr':>9} {'seed':>4} {'rounds to ' + str(target):>15} "
        f"{'best acc':>8} {'final acc':>9} {'last-10':>7} {'s/round':>7}  engine"
    )
    print(head)
    print("-" * len(head))
    for seed, arm, lr, r in rows:
        print(
            f"{arm:>10} {lr:>9g} {seed:>4} {fmt(r['rounds_to_target']):>15} "
            f"{r['best_accuracy']:>8.4f} {r['final_accuracy']:>9.4f} {r['last10']:>7.4f} "
            f"{fmt(seconds_per_round(r), '.2f'):>7}  {r['engine']}"
        )

    def best(arm: str, seed: int, key: str) -> float | None:
        got = [r[key] for s, a, _, r in rows if a == arm and s == seed and r[key] is not None]
        if not got:
            return None
        return min(got) if key == "rounds_to_target" else max(got)

    def paired(arm: str, rounds: bool) -> float:
        if rounds:  # FedAvg's rounds over the arm's best rounds
            per = [
                ratio(best("fedavg", s, "rounds_to_target"), best(arm, s, "rounds_to_target"))
                for s in range(args.seeds)
            ]
        else:  # the arm's best last-10 accuracy minus FedAvg's
            per = [
                (best(arm, s, "last10") or math.nan) - (best("fedavg", s, "last10") or math.nan)
                for s in range(args.seeds)
            ]
        return sum(per) / len(per)

    others = ["fedadam", "fedyogi", "fedadagrad", "fedavgm"]  # the headline pair first
    result: dict[str, Any] = {f"{a}_over_fedavg_rounds": paired(a, True) for a in others}
    result.update({f"{a}_minus_fedavg_last10_acc": paired(a, False) for a in others})
    result.update(target=target, rounds=args.rounds, seeds=args.seeds)
    print(result_line(result))


if __name__ == "__main__":
    main()

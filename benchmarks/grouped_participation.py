"""Grouped, rotating participation against uniform sampling on pathological-shard
MNIST: clients in G fixed groups (seeded) that take turns, a group a round
(selection.policy = grouped_rotation), against McMahan et al. 2017's uniform
draw of C N clients each round.

Setting: the 2NN, 100 clients of 2 label shards each (200 shards of 300),
C = 0.1 (cohorts of 10), E = 1, B = 10, client lr 0.1, evaluated every round on
the test set; each run stops at ``--target`` (0.95) or after ``--cap`` rounds
(300). Arms: ``uniform``; ``grouped10``: 10 groups of 10, each group the whole
cohort of its turn (every client asked exactly once every 10 rounds);
``grouped5``: 5 groups of 20, 10 drawn from the group whose turn it is. Rounds
to target are read off the best-so-far curve, interpolated
(fedforge.evaluation.metrics); a run that missed it within the cap reads nan.
``--quick``: target 0.85, cap 40 rounds, one seed.

Last line: ``RESULT grouped_rounds_uniform=<mean over seeds> grouped_rounds_g10=...
grouped_rounds_g5=... grouped_final_acc_<arm>=... grouped_target=... grouped_seeds=...``

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data \
        python benchmarks/grouped_participation.py [--quick]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from _common import add_workers, mean_of, places, print_settings, result_line, run_arms, workers
from fedforge.config import Config, from_dict

# arm: (policy, groups)
ARMS: dict[str, tuple[str, int | None]] = {
    "uniform": ("uniform", None),
    "g10": ("grouped_rotation", 10),
    "g5": ("grouped_rotation", 5),
}


def config(arm: str, seed: int, args: Any) -> Config:
    policy, groups = ARMS[arm]
    options = {"grouped_rotation": {"groups": groups}} if groups else {}
    return from_dict(
        {
            "name": f"grouped-{arm}-s{seed}-t{args.target:g}-c{args.cap}",
            "seed": seed,
            "model": "2nn",
            "num_clients": 100,
            "partition": {"kind": "shards", "shards_per_client": 2},
            "client_fraction": 0.1,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "rounds": args.cap,
            "target_accuracy": args.target,
            "selection": {"policy": policy},
            "plugin_options": options,
            "workers": workers(args),
            "runs_dir": str(args.places.runs),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="target 0.85, cap 40, one seed")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--cap", type=int, default=300)
    add_workers(parser)
    args = parser.parse_args()
    if args.quick:
        args.target, args.cap, args.seeds = 0.85, 40, 1
    args.places = places("grouped_participation", args.quick)
    torch.set_num_threads(1)
    arms = {a: config(a, 0, args) for a in ARMS}
    print_settings(f"pathological shards MNIST, 2NN: target {args.target}", arms["uniform"], arms)
    rows = run_arms(list(ARMS), config, args, "uniform")
    result: dict[str, Any] = {}
    for arm in ARMS:
        result[f"grouped_rounds_{arm}"] = mean_of(
            [r["rounds_to_target"] for a, _, r in rows if a == arm]
        )
    for arm in ARMS:
        result[f"grouped_final_acc_{arm}"] = mean_of(
            [r["final_accuracy"] for a, _, r in rows if a == arm]
        )
    result.update(grouped_target=args.target, grouped_cap=args.cap, grouped_seeds=args.seeds)
    print(result_line(result))


if __name__ == "__main__":
    main()

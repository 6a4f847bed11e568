"""A learning rate per client and the upload clip relative to recent norms,
against plain FedAvg on pathological-shard MNIST.

Setting: the 2NN, 100 clients of 2 label shards each (200 shards of 300: every
client holds 600 examples, so the ``data_size`` rule would scale nothing here
and is not run), C = 0.1, E = 1, B = 10, client lr 0.1, evaluated every round;
each run stops at ``--target`` (0.9) or after ``--cap`` rounds (60). Arms:
``plain``; ``loss_lr``: ``local.lr_rule = reported_loss`` (each client's lr
times median loss / its last reported loss, held to [0.25, 4]); ``clip1`` and
``clip2``: ``communication.clip_multiple`` 1 and 2 (each client clips its
delta to that multiple of the median norm taken in the last 5 rounds; the first
round unclipped). Rounds to target are read off the best-so-far curve,
interpolated (fedforge.evaluation.metrics); a run that missed it reads nan.
``--quick``: target 0.8, cap 15.

Last line: ``RESULT client_lr_rounds_<arm>=<mean over seeds> ...
client_lr_final_acc_<arm>=... client_lr_target=... client_lr_seeds=...``

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data \
        python benchmarks/client_lr.py [--quick]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from _common import add_workers, mean_of, places, print_settings, result_line, run_arms, workers
from fedforge.config import Config, from_dict

# arm: the settings it adds to plain FedAvg
ARMS: dict[str, dict[str, Any]] = {
    "plain": {},
    "loss_lr": {"local": {"lr_rule": "reported_loss"}},
    "clip1": {"communication": {"clip_multiple": 1.0}},
    "clip2": {"communication": {"clip_multiple": 2.0}},
}


def config(arm: str, seed: int, args: Any) -> Config:
    return from_dict(
        {
            "name": f"client-lr-{arm}-s{seed}-t{args.target:g}-c{args.cap}",
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
            "workers": workers(args),
            "runs_dir": str(args.places.runs),
            **ARMS[arm],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="target 0.8, cap 15, one seed")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--cap", type=int, default=60)
    add_workers(parser)
    args = parser.parse_args()
    if args.quick:
        args.target, args.cap, args.seeds = 0.8, 15, 1
    args.places = places("client_lr", args.quick)
    torch.set_num_threads(1)
    arms = {a: config(a, 0, args) for a in ARMS}
    print_settings(f"pathological shards MNIST, 2NN: target {args.target}", arms["plain"], arms)
    rows = run_arms(list(ARMS), config, args, "plain")
    result: dict[str, Any] = {}
    for key, field in (("rounds", "rounds_to_target"), ("final_acc", "final_accuracy")):
        for arm in ARMS:
            result[f"client_lr_{key}_{arm}"] = mean_of([r[field] for a, _, r in rows if a == arm])
    result.update(client_lr_target=args.target, client_lr_cap=args.cap, client_lr_seeds=args.seeds)
    print(result_line(result))


if __name__ == "__main__":
    main()

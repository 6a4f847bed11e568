"""A learning rate per client and the upload clip relative to recent norms,
against plain FedAvg on pathological-shard MNIST; with ``--split unbalanced``
(``dirichlet``), the lr scaled by client size against plain FedAvg on
quantity-skew MNIST (quantity and label skew).

Setting (``--split shards``, the default): the 2NN, 100 clients of 2 label
shards each (200 shards of 300: every client holds 600 examples, so the
``data_size`` rule would scale nothing here and is not run), C = 0.1, E = 1,
B = 10, client lr 0.1, evaluated every round; each run stops at ``--target``
(0.9) or after ``--cap`` rounds (60). Arms: ``plain``; ``loss_lr``:
``local.lr_rule = reported_loss`` (each client's lr times median loss / its
last reported loss, held to [0.25, 4]); ``clip05``, ``clip1`` and ``clip2``:
``communication.clip_multiple`` 0.5, 1 and 2 (each client clips its delta to
that multiple of the upper median of the norms the clients reported, before
their clip, in the last 5 rounds; the first round unclipped). Rounds to target
are read off the best-so-far curve, interpolated (fedforge.evaluation.metrics);
a run that missed it reads nan.
``--quick``: target 0.8, cap 15.

``--split unbalanced``: the same 2NN, C, E, B and lr on a quantity-skew split
(``partition.kind = quantity``: 100 clients, sizes proportional to
lognormal(0, 1) weights, labels IID, at least 1 example each); arms ``plain``;
``size_lr``: ``local.lr_rule = data_size`` (each client's lr times n_k / the
cohort's mean n, held to [0.25, 4]); ``size_lr_inv``: the same rule with
exponent -1 (mean n / n_k, so that lr times local steps is about equal across
clients); ``size_lr_room`` and ``size_lr_inv_room``: the same two rules with
``local.lr_rule_scales_bounds`` (a client sped up s-fold gets s times the
bound of ``robust.max_norm_multiple``, 10x the median recent norm, which
otherwise refuses its update like any other's). Labels are IID, so the
target is higher: 0.97 (``--quick``: 0.9), cap 60 (``--quick``: 15).

``--split dirichlet``: quantity and label skew at once (``partition.kind =
dirichlet``, alpha 0.5, at least 10 examples a client: each class dealt over the
clients in Dir(0.5) proportions, so sizes and label mixes both vary); the arms of
``unbalanced``; target 0.95 (``--quick``: 0.85), cap 100 (``--quick``: 15).

Last line: ``RESULT client_lr_rounds_<arm>=<mean over seeds> ...
client_lr_final_acc_<arm>=... client_lr_target=... client_lr_seeds=...``
(``--split unbalanced``, ``dirichlet``: ``client_lr_unbalanced_...``,
``client_lr_dirichlet_...``)

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data \
        python benchmarks/client_lr.py [--split unbalanced|dirichlet] [--quick]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from _common import add_workers, mean_of, places, print_settings, result_line, run_arms, workers
from fedforge.config import Config, from_dict

# the lr scaled by client size (exponent 1 and -1) against plain FedAvg
SIZE_ARMS: dict[str, dict[str, Any]] = {
    "plain": {},
    "size_lr": {"local": {"lr_rule": "data_size"}},
    "size_lr_inv": {
        "local": {"lr_rule": "data_size"},
        "plugin_options": {"data_size": {"exponent": -1.0}},
    },
    # the same rules, each sped-up client given its scale times the norm bounds
    "size_lr_room": {"local": {"lr_rule": "data_size", "lr_rule_scales_bounds": True}},
    "size_lr_inv_room": {
        "local": {"lr_rule": "data_size", "lr_rule_scales_bounds": True},
        "plugin_options": {"data_size": {"exponent": -1.0}},
    },
}

# split: its partition, its arms (arm: the settings it adds to plain FedAvg),
# target and cap (full, --quick), its name in the printed settings
SPLITS: dict[str, dict[str, Any]] = {
    "shards": {
        "partition": {"kind": "shards", "shards_per_client": 2},
        "arms": {
            "plain": {},
            "loss_lr": {"local": {"lr_rule": "reported_loss"}},
            "clip05": {"communication": {"clip_multiple": 0.5}},
            "clip1": {"communication": {"clip_multiple": 1.0}},
            "clip2": {"communication": {"clip_multiple": 2.0}},
        },
        "full": (0.9, 60),
        "quick": (0.8, 15),
        "title": "pathological shards",
    },
    "unbalanced": {
        "partition": {"kind": "quantity", "sigma": 1.0},
        "arms": SIZE_ARMS,
        "full": (0.97, 60),
        "quick": (0.9, 15),
        "title": "quantity-skew",
    },
    "dirichlet": {
        "partition": {"kind": "dirichlet", "alpha": 0.5, "min_size": 10},
        "arms": SIZE_ARMS,
        "full": (0.95, 100),
        "quick": (0.85, 15),
        "title": "Dirichlet (quantity and label skew)",
    },
}


def config(arm: str, seed: int, args: Any) -> Config:
    split = SPLITS[args.split]
    tag = "" if args.split == "shards" else f"{args.split}-"
    return from_dict(
        {
            "name": f"client-lr-{tag}{arm}-s{seed}-t{args.target:g}-c{args.cap}",
            "seed": seed,
            "model": "2nn",
            "num_clients": 100,
            "partition": split["partition"],
            "client_fraction": 0.1,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "rounds": args.cap,
            "target_accuracy": args.target,
            "workers": workers(args),
            "runs_dir": str(args.places.runs),
            **split["arms"][arm],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=sorted(SPLITS), default="shards")
    parser.add_argument("--quick", action="store_true", help="lower target, cap 15, one seed")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument(
        "--target", type=float, help="default: shards 0.9, unbalanced 0.97, dirichlet 0.95"
    )
    parser.add_argument("--cap", type=int, help="default: shards 60, unbalanced 60, dirichlet 100")
    add_workers(parser)
    args = parser.parse_args()
    split = SPLITS[args.split]
    target, cap = split["quick" if args.quick else "full"]
    if args.quick:
        args.target, args.cap, args.seeds = target, cap, 1
    args.target = target if args.target is None else args.target
    args.cap = cap if args.cap is None else args.cap
    args.places = places("client_lr", args.quick)
    torch.set_num_threads(1)
    names = list(split["arms"])
    arms = {a: config(a, 0, args) for a in names}
    print_settings(f"{split['title']} MNIST, 2NN: target {args.target}", arms["plain"], arms)
    rows = run_arms(names, config, args, "plain")
    prefix = "client_lr" if args.split == "shards" else f"client_lr_{args.split}"
    result: dict[str, Any] = {}
    for key, field in (("rounds", "rounds_to_target"), ("final_acc", "final_accuracy")):
        for arm in names:
            result[f"{prefix}_{key}_{arm}"] = mean_of([r[field] for a, _, r in rows if a == arm])
    result.update(
        {f"{prefix}_target": args.target, f"{prefix}_cap": args.cap, f"{prefix}_seeds": args.seeds}
    )
    print(result_line(result))


if __name__ == "__main__":
    main()

"""Choosing a setting on a validation split against choosing it on the test set
(``evaluation.validation``): a learning-rate grid on pathological non-IID MNIST
(2NN, 100 clients of two shards each, C = 0.1, E = 1, B = 10), every point with
10% of each client's examples carved out for validation (the same rows at every
point: they depend only on the seed and the partition).

Each point records both curves. The learning rate chosen on validation (its
best validation accuracy) is scored once on the test set: that is the honest
figure. The one chosen on the test set reports its own best test accuracy: the
figure a sweep that reads the test set would print, optimistic by the
selection over points and rounds. The difference is the optimism that choosing
on the test set adds; rounds to ``--target`` are read on each curve too.

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/validation_choice.py
    python benchmarks/validation_choice.py --quick      # two points, 2 rounds

Records under benchmarks/results/validation_choice (a rerun reuses them). Last
line: ``RESULT valchoice_lr_by_validation=... valchoice_lr_by_test=...
valchoice_test_final_of_validation_choice=... valchoice_test_best_of_test_choice=...
valchoice_optimism=... valchoice_rounds_validation=... valchoice_rounds_test=...``
(rounds: to target of the chosen point, on its validation and its test curve).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from _common import fmt, places, result_line, run_record
from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data
from fedforge.evaluation.metrics import rounds_to_target


def config(lr: float, args: Any) -> Config:
    return from_dict(
        {
            "name": f"valchoice-lr{lr:g}-r{args.rounds}",
            "model": "2nn",
            "num_clients": 100,
            "partition": {"kind": "shards", "shards_per_client": 2},
            "client_fraction": 0.1,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": lr,
            "rounds": args.rounds,
            "target_accuracy": None,  # every point runs all its rounds
            "evaluation": {"every": args.eval_every, "validation": 0.1},
            "workers": 1,
            "threads": 1,
            "runs_dir": str(args.places.runs),
            **({"data_dir": args.data_dir} if args.data_dir else {}),
        }
    )


def best(curve: list[list[float]]) -> float:
    return max(a for _, a in curve)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lrs", default="0.02,0.05,0.1,0.2,0.5")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--data-dir")
    p.add_argument("--quick", action="store_true", help="two points, 2 rounds")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.lrs, args.rounds, args.eval_every = "0.05,0.1", 2, 1
    args.places = places("validation_choice", args.quick)
    records: dict[float, dict[str, Any]] = {}
    data = None
    print(f"lr grid, {args.rounds} rounds, 10% of each client's examples for validation")
    print(f"{'lr':>6} {'best val':>9} {'best test':>9} {'final test':>10}")
    for lr in (float(x) for x in args.lrs.split(",")):
        cfg = config(lr, args)
        data = data or load_federated_data(cfg)
        rec = run_record(cfg, data, args.places, target=args.target)
        assert rec["target_read"] == "validation", rec["target_read"]
        records[lr] = rec
        print(
            f"{lr:>6g} {best(rec['validation_curve']):>9.4f} {best(rec['curve']):>9.4f} "
            f"{rec['final_accuracy']:>10.4f}",
            flush=True,
        )
    by_val = max(records, key=lambda lr: best(records[lr]["validation_curve"]))
    by_test = max(records, key=lambda lr: best(records[lr]["curve"]))
    chosen = records[by_val]
    test_curve = chosen["curve"]
    on_test = rounds_to_target([x for x, _ in test_curve], [a for _, a in test_curve], args.target)
    fields = {
        "valchoice_lr_by_validation": by_val,
        "valchoice_lr_by_test": by_test,
        "valchoice_test_final_of_validation_choice": chosen["final_accuracy"],
        "valchoice_test_best_of_test_choice": best(records[by_test]["curve"]),
        "valchoice_optimism": best(records[by_test]["curve"]) - chosen["final_accuracy"],
        "valchoice_rounds_validation": chosen["rounds_to_target"],
        "valchoice_rounds_test": on_test,
    }
    print(
        f"chosen on validation: lr {by_val:g}, test accuracy {chosen['final_accuracy']:.4f} "
        f"(rounds to {args.target} on validation {fmt(chosen['rounds_to_target'])}, "
        f"on test {fmt(on_test)}); chosen on test: lr {by_test:g}, its best test "
        f"accuracy {best(records[by_test]['curve']):.4f}"
    )
    print(result_line(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())

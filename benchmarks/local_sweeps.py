"""Local-training sweeps on pathological non-IID MNIST (2NN, 100 clients of two
shards each, C = 0.1, B = 10, lr 0.1):

- FedProx's mu (Li et al. 2020): mu = 0 (FedAvg), 0.001, 0.01, 0.1 at E = 5,
  accuracy and rounds to ``--target``;
- FedAvg's local epochs E = 1, 2, 5, 10, 20 (the claim of McMahan et al. 2017,
  section 3, and of Li et al. 2020: too many local epochs on non-IID data lower
  the accuracy reached, past E of about 10), accuracy after the same rounds.

    python benchmarks/local_sweeps.py --rounds 30
    python benchmarks/local_sweeps.py --quick        # two points each, 2 rounds

Every point runs the same number of rounds (``--rounds``), evaluates on the
test set every ``--eval-every`` rounds (no validation split is carved: the test
set is the yardstick, as in Table 2), and is kept as a record under
benchmarks/results/local_sweeps (a rerun reuses it). Last line:
``RESULT fedprox_mu_<mu>_acc=... fedprox_mu_<mu>_best=... fedprox_mu_<mu>_rounds=...
epochs_<E>_acc=... epochs_<E>_best=...`` (acc: final; best: the best evaluation;
rounds: to target, nan when not reached). The centralised baseline
(mcmahan_table1.py --central) is printed beside them when it has been run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from _common import central_baseline, fmt, places, result_line, run_record
from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data


def config(name: str, algorithm: str, mu: float, epochs: int, args: Any) -> Config:
    return from_dict(
        {
            "name": name,
            "model": "2nn",
            "algorithm": algorithm,
            "fedprox": {"mu": mu},
            "num_clients": 100,
            "partition": {"kind": "shards", "shards_per_client": 2},
            "client_fraction": 0.1,
            "local_epochs": epochs,
            "batch_size": 10,
            "lr": 0.1,
            "rounds": args.rounds,
            "target_accuracy": None,  # every point runs all its rounds
            "evaluation": {"every": args.eval_every},
            "workers": 1,
            "threads": 1,
            "runs_dir": str(args.places.runs),
            **({"data_dir": args.data_dir} if args.data_dir else {}),
        }
    )


def key(x: float) -> str:
    return f"{x:g}".replace(".", "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mus", default="0,0.001,0.01,0.1", help="FedProx's mu (0: FedAvg)")
    p.add_argument("--mu-epochs", type=int, default=5, help="E of the mu sweep")
    p.add_argument("--epochs", default="1,2,5,10,20", help="E of the FedAvg sweep")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--parts", default="mu,epochs", help="mu, epochs or both")
    p.add_argument("--data-dir")
    p.add_argument("--quick", action="store_true", help="two points each, 2 rounds")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.mus, args.epochs, args.rounds, args.eval_every = "0,0.1", "1,2", 2, 1
    args.places = places("local_sweeps", args.quick)
    parts = args.parts.split(",")
    fields: dict[str, object] = {}
    data = None
    if "mu" in parts:
        print(f"FedProx mu at E = {args.mu_epochs}, {args.rounds} rounds, target {args.target}")
        for mu in (float(m) for m in args.mus.split(",")):
            algorithm = "fedprox" if mu else "fedavg"
            name = f"mu{mu:g}-e{args.mu_epochs}-r{args.rounds}"
            cfg = config(name, algorithm, mu, args.mu_epochs, args)
            data = data or load_federated_data(cfg)
            rec = run_record(cfg, data, args.places, target=args.target)
            print(
                f"  mu={mu:<6g} final {fmt(rec['final_accuracy'], '.4f')} best "
                f"{fmt(rec['best_accuracy'], '.4f')} rounds to target "
                f"{fmt(rec['rounds_to_target'])} ({rec['wall_seconds'] or 0:.0f} s)",
                flush=True,
            )
            fields[f"fedprox_mu_{key(mu)}_acc"] = rec["final_accuracy"]
            fields[f"fedprox_mu_{key(mu)}_best"] = rec["best_accuracy"]
            fields[f"fedprox_mu_{key(mu)}_rounds"] = rec["rounds_to_target"]
    if "epochs" in parts:
        print(f"FedAvg local epochs, {args.rounds} rounds")
        for e in (int(x) for x in args.epochs.split(",")):
            cfg = config(f"epochs{e}-r{args.rounds}", "fedavg", 0.0, e, args)
            data = data or load_federated_data(cfg)
            rec = run_record(cfg, data, args.places, target=args.target)
            print(
                f"  E={e:<3} final {fmt(rec['final_accuracy'], '.4f')} best "
                f"{fmt(rec['best_accuracy'], '.4f')} rounds to target "
                f"{fmt(rec['rounds_to_target'])} ({rec['wall_seconds'] or 0:.0f} s)",
                flush=True,
            )
            fields[f"epochs_{e}_acc"] = rec["final_accuracy"]
            fields[f"epochs_{e}_best"] = rec["best_accuracy"]
    print(central_baseline() or "centralised baseline: not run (mcmahan_table1.py --central)")
    print(result_line(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())

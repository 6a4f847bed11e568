"""Per-FedAvg (FO and HF) vs FedAvg vs FedAvg + fine-tuning: personalised
accuracy on pathological-shard MNIST (issue 4; Fallah, Mokhtari, Ozdaglar 2020,
"Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach", whose figure is the average accuracy of the users'
models after one local gradient step from the trained model).

Setting: 100 clients of McMahan's 2 label shards each (2 classes a client), 2NN,
C = 0.1, B = 10, 20% of each client's data held out (``evaluation.clients``). FedAvg
trains E = 1 epoch at lr 0.05 (48 local steps a round); Per-FedAvg takes tau = 48
meta-steps a round (each on 2 batches, HF on 3 plus a Hessian-vector product,
exact by double backward) with alpha = beta = 0.05. After the last round every
client is scored on its held-out slice with the global model ("global"), and
after 1 and ``--ft-steps`` SGD steps of size alpha = 0.05 on its own training
data from the global model ("personal"; for FedAvg this is FedAvg + local
fine-tuning), all on the same slices and the same minibatch draws.

Prints a table (mean and 10th percentile of the per-client accuracies), then
``RESULT``: ``perfedavg_minus_fedavg_personal`` is Per-FedAvg (HF)'s mean
personalised accuracy (1 step) minus FedAvg's global per-client accuracy;
``..._ft_...`` keys subtract FedAvg + fine-tuning (1 step) instead; ``_fo_``
keys are the FO variant. Paired per seed. Runs per seed in the order FedAvg, FO,
HF. ``--quick`` runs 10 rounds, one seed.

    OMP_NUM_THREADS=1 python benchmarks/perfedavg.py [--quick] [--rounds 200] [--seeds 2]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data
from fedforge.evaluation.clients import client_accuracies
from fedforge.evaluation.personal import personal_accuracies
from fedforge.server.experiment import build
from fedforge.server.loop import run

LR = 0.05  # FedAvg's lr, Per-FedAvg's alpha and beta, the fine-tuning step
STEPS = 48  # tau: one epoch of FedAvg's steps (480 training examples, B = 10)
ARMS = (("fedavg", None), ("perfedavg_fo", "fo"), ("perfedavg_hf", "hf"))


def _config(variant: str | None, rounds: int, seed: int, beta: float = LR) -> Config:
    suffix = f"-beta{beta:g}" if beta != LR else ""
    cfg: dict[str, Any] = {
        "name": f"perfedavg-bench-{variant or 'fedavg'}{suffix}",
        "seed": seed,
        "model": "2nn",
        "num_clients": 100,
        "partition": {"kind": "shards", "shards_per_client": 2},
        "client_fraction": 0.1,
        "local_epochs": 1,
        "batch_size": 10,
        "lr": LR,
        "rounds": rounds,
        "target_accuracy": None,
        # the global test accuracy once, at the end
        "evaluation": {"every": rounds, "clients": True, "holdout": 0.2},
        "diagnostics": {"updates": False},
        "engine": "serial",
        "dtype": "float32",
    }
    if variant is not None:
        cfg["algorithm"] = "perfedavg"
        cfg["perfedavg"] = {"variant": variant, "alpha": LR, "beta": beta, "steps": STEPS}
    return from_dict(cfg)


def _mean_p10(rows: list[tuple[int, float, float, int]]) -> tuple[float, float]:
    acc = np.asarray([r[1] for r in rows], dtype=np.float64)
    return float(acc.mean()), float(np.percentile(acc, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 rounds, one seed")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--ft-steps", type=int, default=5, help="the longer fine-tuning")
    parser.add_argument(
        "--hf-beta", type=float, default=LR, help="HF's outer (meta) step beta alone"
    )
    parser.add_argument(
        "--arms", default=",".join(a for a, _ in ARMS), help="fedavg and any of the others"
    )
    args = parser.parse_args()
    chosen = args.arms.split(",")
    if "fedavg" not in chosen or not set(chosen) <= {a for a, _ in ARMS}:
        parser.error(
            f"--arms {args.arms!r}: a subset of {', '.join(a for a, _ in ARMS)} with fedavg"
        )
    rounds, seeds = (10, 1) if args.quick else (args.rounds, args.seeds)
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    data = load_federated_data(_config(None, rounds, 0))
    for seed in range(seeds):
        if seed > 0:
            data = load_federated_data(_config(None, rounds, seed))  # the seed's partition
        for arm, variant in ARMS:
            if arm not in chosen:
                continue
            cfg = _config(variant, rounds, seed, args.hf_beta if variant == "hf" else LR)
            t0 = time.perf_counter()
            res = run(cfg, data=data, store=False)
            seconds = time.perf_counter() - t0
            exp = build(cfg, data)  # the same held-out slices as the run's
            last = rounds - 1
            glob = _mean_p10(client_accuracies(exp, res.params))
            one = _mean_p10(personal_accuracies(exp, res.params, last, steps=1, lr=LR))
            more = _mean_p10(personal_accuracies(exp, res.params, last, args.ft_steps, LR))
            test = res.summary["final_accuracy"]
            rows.append(
                dict(arm=arm, seed=seed, glob=glob, one=one, more=more, test=test, s=seconds)
            )
    print(
        f"pathological shards MNIST, 100 clients x 2 shards, 2NN, C=0.1, B=10, {rounds} rounds; "
        f"alpha = beta = lr = {LR} (HF's beta {args.hf_beta}), tau = {STEPS}; "
        "per-client accuracy on 20% held-out slices"
    )
    k = args.ft_steps
    print(
        f"{'algorithm':>13} {'seed':>4} {'global mean/p10':>16} {'1 step mean/p10':>16} "
        f"{f'{k} steps mean/p10':>17} {'test acc':>8} {'seconds':>8}"
    )
    for r in rows:
        cells = [f"{m:.4f}/{p:.4f}" for m, p in (r["glob"], r["one"], r["more"])]
        print(
            f"{r['arm']:>13} {r['seed']:>4} {cells[0]:>16} {cells[1]:>16} {cells[2]:>17} "
            f"{r['test']:>8.4f} {r['s']:>8.1f}"
        )

    def paired(arm: str, key: str, base_key: str) -> float:
        diffs = [
            p[key][0] - a[base_key][0]
            for a in rows
            for p in rows
            if a["seed"] == p["seed"] and a["arm"] == "fedavg" and p["arm"] == arm
        ]
        return sum(diffs) / len(diffs) if diffs else float("nan")

    fedavg_ft = sum(r["one"][0] - r["glob"][0] for r in rows if r["arm"] == "fedavg") / seeds
    result = {
        "perfedavg_minus_fedavg_personal": paired("perfedavg_hf", "one", "glob"),
        "perfedavg_minus_fedavg_ft_personal": paired("perfedavg_hf", "one", "one"),
        "perfedavg_fo_minus_fedavg_personal": paired("perfedavg_fo", "one", "glob"),
        "perfedavg_fo_minus_fedavg_ft_personal": paired("perfedavg_fo", "one", "one"),
        "fedavg_ft_minus_fedavg_global": fedavg_ft,
        "hf_beta": args.hf_beta,
        "rounds": rounds,
        "seeds": seeds,
    }
    print(
        "RESULT "
        + " ".join(
            f"{n}={v:.4f}" if isinstance(v, float) else f"{n}={v}" for n, v in result.items()
        )
    )


if __name__ == "__main__":
    main()

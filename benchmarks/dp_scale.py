"""Central DP at scale, and what it buys against membership inference.

DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent
language models") over a large population: MNIST split IID over N = 10,000
clients of 6 examples, fixed-size cohorts of m = 1,000 (q = 0.1) and m = 500,
adaptive clipping (Andrew et al. 2021: C follows the median update norm,
gamma = 0.5, eta = 0.2, C_0 = 0.5, sigma_b = m / 20, the noise split between the
count and the update so the pair spends the calibrated z), 2NN, E = 5, B = 3
(two local steps an epoch), lr 0.1, server lr 1, T = 100 rounds, delta = 1e-5
(< 1/N). z comes from ``calibrate_noise`` (RDP, fixed-size cohorts, replace-one)
for each epsilon; the non-private run is plain FedAvg (no clipping, no noise).
The curve it is set beside (``dp_utility.py``: N = 1,000, m = 50) lost 16 points
at epsilon 8 and was at chance at epsilon 2.

Each final model is then audited with the loss-threshold membership-inference
attack (Yeom et al. 2018; ``fedforge.evaluation.membership``): members are
training rows of the clients, non-members MNIST test rows, equal counts
(``--mia-examples`` of each, default 10,000); its ROC AUC (0.5: no signal) and
best-threshold advantage.

Last line ``RESULT central_dp_m<m>_eps<e>=<accuracy> ... central_dp_nodp=
central_dp_m<m>_gap_eps<e>=<nodp - eps accuracy> mia_auc_nodp= mia_auc_eps<e>=
mia_adv_...`` (the MIA keys of the m = 1,000 runs). ``--quick``: N = 1,000,
m = 100, T = 5, epsilon 8 and 2, 1,000 audited rows of each kind.

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/dp_scale.py --quick
    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/dp_scale.py
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data
from fedforge.evaluation.membership import MembershipAudit, audit_model, balanced_rows
from fedforge.privacy.accountant import calibrate_noise
from fedforge.server.experiment import build
from fedforge.server.loop import run

DELTA = 1e-5
CLIP = 0.5


def _config(args: argparse.Namespace, m: int, privacy: dict[str, Any]) -> Config:
    return from_dict(
        {
            "name": f"dp-scale-m{m}",
            "seed": args.seed,
            "model": "2nn",
            "engine": "vectorized",
            "num_clients": args.clients,
            "partition": {"kind": "iid"},
            "client_fraction": m / args.clients,
            "local_epochs": args.epochs,
            "batch_size": args.batch,
            "lr": 0.1,
            "rounds": args.rounds,
            "target_accuracy": None,
            "evaluation": {"every": args.rounds},
            "diagnostics": {"updates": False},
            "dtype": "float32",
            "privacy": {"delta": DELTA, **privacy},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1,000, m = 100, T = 5")
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--cohorts", type=int, nargs="+", default=[1000, 500])
    parser.add_argument("--eps", type=float, nargs="+", default=[8.0, 2.0, 4.0, 1.0])
    parser.add_argument("--eps-small-cohort", type=float, nargs="*", default=[8.0, 2.0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--mia-examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.clients, args.cohorts, args.rounds = 1000, [100], 5
        args.eps, args.mia_examples = [8.0, 2.0], 1000
    torch.set_num_threads(1)
    big = args.cohorts[0]
    data = load_federated_data(_config(args, big, {}))
    exp = build(_config(args, big, {}), data=data)
    rows = np.concatenate([np.asarray(ix) for ix in data.partition.client_indices])
    mem, non = balanced_rows(rows, np.arange(len(data.test_y)), args.mia_examples, args.seed)
    members = (data.train_x[mem], data.train_y[mem])
    nonmembers = (data.test_x[non], data.test_y[non])

    def audit(params: torch.Tensor) -> MembershipAudit:
        return audit_model(exp.model, exp.spec, params, members, nonmembers, exp.algorithm.loss_fn)

    print(
        f"MNIST 2NN, IID, N = {args.clients} clients of {len(rows) // args.clients}, "
        f"E = {args.epochs}, B = {args.batch}, lr 0.1, adaptive clip from C = {CLIP} "
        f"(median), T = {args.rounds} rounds, delta = {DELTA:g}, seed {args.seed}; "
        f"MIA on {len(mem)} members / {len(non)} non-members"
    )
    print(
        f"{'m':>5} {'epsilon':>8} {'z':>7} {'spent':>7} {'acc':>7} "
        f"{'MIA AUC':>7} {'MIA adv':>7} {'s':>6}"
    )
    result: dict[str, float] = {}
    t0 = time.perf_counter()
    res = run(_config(args, big, {}), data=data, store=False)
    nodp = float(res.summary["final_accuracy"])
    a = audit(res.params)
    print(
        f"{big:>5} {'inf':>8} {0:>7.4f} {'inf':>7} {nodp:>7.4f} {a.auc:>7.4f} "
        f"{a.advantage:>7.4f} {time.perf_counter() - t0:>6.0f}",
        flush=True,
    )
    result["central_dp_nodp"] = nodp
    mia = {"mia_auc_nodp": a.auc, "mia_adv_nodp": a.advantage}
    for m in args.cohorts:
        for eps in args.eps if m == big else args.eps_small_cohort:
            t0 = time.perf_counter()
            z = calibrate_noise(eps, DELTA, args.rounds, m / args.clients, args.clients)
            priv = {"dp": "central", "noise_multiplier": z, "clip_norm": CLIP}
            cfg = _config(args, m, {**priv, "adaptive_clip": True})
            res = run(cfg, data=data, store=False)
            acc = float(res.summary["final_accuracy"])
            spent = float(res.summary["privacy"]["epsilon"])
            a = audit(res.params)
            print(
                f"{m:>5} {eps:>8g} {z:>7.4f} {spent:>7.3f} {acc:>7.4f} "
                f"{a.auc:>7.4f} {a.advantage:>7.4f} {time.perf_counter() - t0:>6.0f}",
                flush=True,
            )
            result[f"central_dp_m{m}_eps{eps:g}"] = acc
            result[f"central_dp_m{m}_gap_eps{eps:g}"] = nodp - acc
            if m == big:
                mia[f"mia_auc_eps{eps:g}"] = a.auc
                mia[f"mia_adv_eps{eps:g}"] = a.advantage
    print("RESULT " + " ".join(f"{k}={v:.4f}" for k, v in {**result, **mia}.items()))


if __name__ == "__main__":
    main()

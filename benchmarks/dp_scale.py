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
    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/dp_scale.py --workers 7
"""

from __future__ import annotations

import argparse
import math
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import torch

from fedforge.config import Config, from_dict
from fedforge.data.federated import FederatedData, load_federated_data
from fedforge.evaluation.membership import balanced_rows, loss_threshold_attack, per_example_losses
from fedforge.privacy.accountant import calibrate_noise
from fedforge.server.experiment import Experiment, build
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


def central_privacy(
    eps: float, rounds: int, rate: float, clients: int, clip: float, adaptive: bool
) -> tuple[dict[str, Any], float]:
    """The ``privacy`` section of central DP-FedAvg spending ``eps`` at ``DELTA`` over
    ``rounds`` rounds of fixed-size cohorts (``rate`` of ``clients``), and its z."""
    z = calibrate_noise(eps, DELTA, rounds, rate, clients)
    priv = {"dp": "central", "noise_multiplier": z, "clip_norm": clip, "adaptive_clip": adaptive}
    return priv, z


def audit_losses(
    exp: Experiment,
    data: FederatedData,
    params: torch.Tensor,
    count: int | None,
    seed: int,
    pool: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example losses of ``params`` on ``count`` members (rows the clients hold)
    and as many non-members drawn from ``pool`` (None: the test set), by
    ``balanced_rows``."""
    px, py = pool if pool is not None else (data.test_x, data.test_y)
    rows = np.concatenate([np.asarray(ix) for ix in data.partition.client_indices])
    mem, non = balanced_rows(rows, np.arange(len(py)), count, seed)
    loss = exp.algorithm.loss_fn
    return (
        per_example_losses(exp.model, exp.spec, params, data.train_x[mem], data.train_y[mem], loss),
        per_example_losses(exp.model, exp.spec, params, px[non], py[non], loss),
    )


def _arm(args: argparse.Namespace, m: int, eps: float | None) -> dict[str, float]:
    """One run (``eps`` None: plain FedAvg) and the attack on its final model."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    big = args.cohorts[0]
    data = load_federated_data(_config(args, big, {}))
    exp = build(_config(args, big, {}), data=data)
    out = {"z": 0.0, "spent": math.inf}
    priv: dict[str, Any] = {}
    if eps is not None:
        priv, out["z"] = central_privacy(
            eps, args.rounds, m / args.clients, args.clients, CLIP, True
        )
    res = run(_config(args, m, priv), data=data, store=False)
    if eps is not None:
        out["spent"] = float(res.summary["privacy"]["epsilon"])
    mem_loss, non_loss = audit_losses(exp, data, res.params, args.mia_examples, args.seed)
    a = loss_threshold_attack(mem_loss, non_loss)
    out.update(acc=float(res.summary["final_accuracy"]), auc=a.auc, adv=a.advantage)
    out["audited"] = float(a.members)
    out["s"] = time.perf_counter() - t0
    return out


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
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.clients, args.cohorts, args.rounds = 1000, [100], 5
        args.eps, args.mia_examples = [8.0, 2.0], 1000
    big = args.cohorts[0]
    arms: list[tuple[int, float | None]] = [(big, None)]
    for m in args.cohorts:
        arms += [(m, e) for e in (args.eps if m == big else args.eps_small_cohort)]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        outs = list(pool.map(_arm, [args] * len(arms), *zip(*arms, strict=True)))
    print(
        f"MNIST 2NN, IID, N = {args.clients} clients, E = {args.epochs}, B = {args.batch}, "
        f"lr 0.1, adaptive clip from C = {CLIP} (median), T = {args.rounds} rounds, "
        f"delta = {DELTA:g}, seed {args.seed}; MIA on {outs[0]['audited']:.0f} members and "
        "as many test rows"
    )
    print(
        f"{'m':>5} {'epsilon':>8} {'z':>7} {'spent':>7} {'acc':>7} "
        f"{'MIA AUC':>7} {'MIA adv':>7} {'s':>6}"
    )
    for (m, eps), o in zip(arms, outs, strict=True):
        print(
            f"{m:>5} {eps if eps is not None else math.inf:>8g} {o['z']:>7.4f} "
            f"{o['spent']:>7.3f} {o['acc']:>7.4f} {o['auc']:>7.4f} {o['adv']:>7.4f} {o['s']:>6.0f}"
        )
    nodp = outs[0]
    result: dict[str, float] = {"central_dp_nodp": nodp["acc"]}
    mia = {"mia_auc_nodp": nodp["auc"], "mia_adv_nodp": nodp["adv"]}
    for (m, eps), o in zip(arms[1:], outs[1:], strict=True):
        result[f"central_dp_m{m}_eps{eps:g}"] = o["acc"]
        result[f"central_dp_m{m}_gap_eps{eps:g}"] = nodp["acc"] - o["acc"]
        if m == big:
            mia[f"mia_auc_eps{eps:g}"] = o["auc"]
            mia[f"mia_adv_eps{eps:g}"] = o["adv"]
    print("RESULT " + " ".join(f"{k}={v:.4f}" for k, v in {**result, **mia}.items()))


if __name__ == "__main__":
    main()

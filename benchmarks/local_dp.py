"""Local DP utility: final MNIST accuracy against a per-upload epsilon, at two
cohort sizes, beside the central-DP curve of ``dp_utility.py``.

Local DP (``privacy.dp: local``): every sampled client clips its delta to C and
adds N(0, (z C)^2) before upload, so the server (trusted with nothing) sees each
update noised. z is calibrated by ``privacy.round_epsilon`` (the accountant's
``calibrate_local_noise``: the smallest z whose one Gaussian release, replace-one
sensitivity 2 C, spends at most epsilon at delta; the run's accountant, RDP).
A client sampled k times has spent the k-fold composition, which the run
reports (``local_epsilon_max``/``_median`` over the clients that uploaded).

Setting (the central curve's): MNIST, 2NN, IID over N = 1000 clients of 60
examples, fixed-size cohorts of m = 50 and m = 500, E = 1, B = 10, lr 0.1, server
lr 1, C = 0.5, delta = 1e-5, T = 100 rounds, one seed; epsilon = inf is the
same clipped run without noise. The central curve (N = 1000, m = 50, T = 100)
spends its epsilon over the whole run and against anyone who sees the models;
local DP's per-upload epsilon is against the server, and its total is the
composition over a client's uploads.

Last line ``RESULT local_dp_m<m>_eps<e>=<accuracy> ... local_dp_m<m>_nodp=``
and ``local_dp_m<m>_eps<e>_total_max`` (the largest total epsilon of a client).
``--quick``: N = 100, m = 10 and 50, T = 5, epsilon 10 and 1.

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/local_dp.py --quick
    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/local_dp.py
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch

from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data
from fedforge.server.loop import run

EPSILONS = (10.0, 5.0, 2.0, 1.0)
DELTA = 1e-5
CLIP = 0.5


def _config(args: argparse.Namespace, cohort: int, privacy: dict[str, Any], **more: Any) -> Config:
    return from_dict(
        {
            "name": f"local-dp-m{cohort}",
            "seed": args.seed,
            "model": "2nn",
            "num_clients": args.clients,
            "partition": {"kind": "iid"},
            "client_fraction": cohort / args.clients,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "rounds": args.rounds,
            "target_accuracy": None,
            "evaluation": {"every": args.rounds},
            "diagnostics": {"updates": False},
            "dtype": "float32",
            "privacy": {"delta": DELTA, **privacy},
            **more,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 100, m = 10/50, T = 5")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--cohorts", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--eps", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.clients, args.cohorts, args.rounds, args.eps = 100, [10, 50], 5, [10.0, 1.0]
    torch.set_num_threads(1)
    data = load_federated_data(_config(args, args.cohorts[0], {}))
    print(
        f"MNIST 2NN, IID, N = {args.clients} clients, E = 1, B = 10, lr 0.1, C = {CLIP}, "
        f"T = {args.rounds} rounds, delta = {DELTA:g}, seed {args.seed}; local DP, "
        "z calibrated to the per-upload epsilon (RDP)"
    )
    print(
        f"{'m':>5} {'eps/upload':>10} {'z':>7} {'total max':>9} {'median':>7} {'acc':>7} {'s':>6}"
    )
    result: dict[str, float] = {}
    for m in args.cohorts:
        for eps in (*args.eps, math.inf):
            if math.isinf(eps):
                cfg = _config(args, m, {}, communication={"clip_norm": CLIP})
            else:
                cfg = _config(args, m, {"dp": "local", "clip_norm": CLIP, "round_epsilon": eps})
            t0 = time.perf_counter()
            res = run(cfg, data=data, store=False)
            secs = time.perf_counter() - t0
            acc = float(res.summary["final_accuracy"])
            priv = res.summary.get("privacy") or {}
            z = float(priv.get("noise_multiplier", 0.0))
            total = float(priv.get("epsilon") or math.inf)
            median = float(priv.get("local_epsilon_median") or math.inf)
            print(
                f"{m:>5} {eps:>10g} {z:>7.4f} {total:>9.2f} {median:>7.2f} {acc:>7.4f} "
                f"{secs:>6.0f}",
                flush=True,
            )
            key = f"local_dp_m{m}_" + ("nodp" if math.isinf(eps) else f"eps{eps:g}")
            result[key] = acc
            if not math.isinf(eps):
                result[f"{key}_total_max"] = total
    print("RESULT " + " ".join(f"{k}={v:.4f}" for k, v in result.items()))


if __name__ == "__main__":
    main()

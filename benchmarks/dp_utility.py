"""DP utility curve (issue 7): final MNIST accuracy against epsilon for central
DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent
language models"), distributed DP against central DP at equal epsilon, and
privacy tiers (seed 003, 3.3) against the same run without tiers.

Setting: MNIST, 2NN, IID over N = 1000 clients of 60 examples, fixed-size
cohorts of m = q N clients, E = 1, B = 10, lr 0.1, server lr 1, every delta
clipped to C = 0.5, delta = 1e-5 (< 1/N), one seed. For each epsilon in
{1, 2, 4, 8} the noise multiplier z comes from the calibration helper
(``fedforge.privacy.accountant.calibrate_noise``: the smallest z whose T rounds spend at
most epsilon, RDP, fixed-size sampling); epsilon = inf is the same clipped run
without noise (``communication.clip_norm``). Distributed DP runs the same z with
secure aggregation: each client adds z C / sqrt(n_min), n_min = ceil(0.66 m),
so with all m clients surviving the sum carries z sqrt(m / n_min) C, more than
the central run's z C, at the same accounted epsilon (the accounting is exact at
n_min survivors, conservative above). Tiers: 30% of the clients (drawn from the
seed) clip and add local DP noise z_tier C before the mask, the rest only clip;
compared with the secure-aggregation run without tiers (clipping alone).

Why the 2NN and not the CNN: DP-FedAvg needs large cohorts for the noise z C / m
on the mean to be small, and each distributed-DP and tier round is a secure
aggregation with m (m - 1) / 2 pairwise masks of P words; the CNN's P is 8x the
2NN's (1.66M) and its local steps about 10x as costly on a CPU, which puts even
the reduced grid out of this machine's reach. The noise per coordinate, z C / m,
does not depend on the model, so the curve's shape carries over.

Prints the curve, the tiers table, then as its last line ``RESULT acc_eps1=
acc_eps8= acc_nodp=`` (final test accuracy) and the other cells
(``acc_eps2``, ``acc_eps4``, ``dist_minus_central_eps<e>``, ``tiers_minus_notiers``).
Accuracies are deterministic (derived randomness); seconds are for the cost
estimate only. ``--quick``: m = 20, T = 20 rounds, distributed DP at epsilon 4
only (about 2 minutes on one core).

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/dp_utility.py --quick
    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/dp_utility.py
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch

from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data
from fedforge.privacy.accountant import calibrate_noise
from fedforge.privacy.secagg_codec import min_survivors
from fedforge.server.loop import run

EPSILONS = (1.0, 2.0, 4.0, 8.0)
DELTA = 1e-5
CLIP = 0.5
THRESHOLD = 0.66  # secure aggregation's t = ceil(0.66 m): n_min of distributed DP


def _config(args: argparse.Namespace, name: str, privacy: dict[str, Any], **more: Any) -> Config:
    return from_dict(
        {
            "name": name,
            "seed": args.seed,
            "model": "2nn",
            "num_clients": args.clients,
            "partition": {"kind": "iid"},
            "client_fraction": args.fraction,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "rounds": args.rounds,
            "target_accuracy": None,
            "evaluation": {"every": args.rounds},  # the test accuracy once, at the end
            "diagnostics": {"updates": False},
            "dtype": "float32",
            "privacy": {"delta": DELTA, "secagg_threshold": THRESHOLD, **privacy},
            **more,
        }
    )


def _run(cfg: Config, data: Any) -> tuple[float, dict[str, Any], float]:
    t0 = time.perf_counter()
    res = run(cfg, data=data, store=False)
    if res.skipped:
        print(f"  note: {cfg.name} skipped rounds {[r for r, _ in res.skipped]}")
    return float(res.summary["final_accuracy"]), res.summary, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="m = 20, 20 rounds, one eps")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--fraction", type=float, default=0.05, help="q: m = q N a round")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--dist-eps", type=float, nargs="*", default=list(EPSILONS))
    parser.add_argument("--tier-z", type=float, default=1.0, help="the high tier's local z")
    parser.add_argument("--high-fraction", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.fraction, args.rounds, args.dist_eps = 0.02, 20, [4.0]
    torch.set_num_threads(1)
    m = max(1, math.floor(args.fraction * args.clients + 1e-9))
    n_min = min_survivors(THRESHOLD, m)
    data = load_federated_data(_config(args, "dp-utility-load", {}))
    rows: list[dict[str, Any]] = []
    for eps in (*EPSILONS, math.inf):
        row: dict[str, Any] = {"eps": eps}
        if math.isinf(eps):
            cfg = _config(args, "dp-nodp", {}, communication={"clip_norm": CLIP})
            row["z"], row["spent"] = 0.0, math.inf
            row["central"], _, row["s_central"] = _run(cfg, data)
            rows.append(row)
            continue
        t0 = time.perf_counter()
        z = calibrate_noise(eps, DELTA, args.rounds, m / args.clients, args.clients, "rdp", "fixed")
        row["z"], row["s_calibrate"] = z, time.perf_counter() - t0
        priv = {"noise_multiplier": z, "clip_norm": CLIP}
        cfg = _config(args, f"dp-central-{eps:g}", {**priv, "dp": "central"})
        row["central"], summary, row["s_central"] = _run(cfg, data)
        row["spent"] = summary["privacy"]["epsilon"]
        if eps in args.dist_eps:
            cfg = _config(args, f"dp-dist-{eps:g}", {**priv, "dp": "distributed", "secagg": True})
            row["dist"], summary, row["s_dist"] = _run(cfg, data)
            assert summary["privacy"]["epsilon"] == row["spent"]  # accounted as central
        rows.append(row)
    tiers: list[dict[str, Any]] = []
    plain = _config(args, "dp-secagg-clip", {"secagg": True}, communication={"clip_norm": CLIP})
    acc, _, secs = _run(plain, data)
    tiers.append({"run": "SecAgg, no tiers", "acc": acc, "s": secs, "summary": None})
    tiered = {
        "secagg": True,
        "noise_multiplier": args.tier_z,
        "clip_norm": CLIP,
        "tiers": {"high_fraction": args.high_fraction},
    }
    acc, summary, secs = _run(_config(args, "dp-tiers", tiered), data)
    tiers.append(
        {
            "run": f"tiers, {args.high_fraction:.0%} high",
            "acc": acc,
            "s": secs,
            "summary": summary["privacy"],
        }
    )

    print(
        f"MNIST 2NN, IID, N = {args.clients} clients, m = {m} a round (fixed), E = 1, B = 10, "
        f"lr 0.1, C = {CLIP}, T = {args.rounds} rounds, delta = {DELTA:g}, seed {args.seed}; "
        f"distributed DP: n_min = {n_min}, noise on the sum z sqrt(m / n_min) C = "
        f"{math.sqrt(m / n_min):.3f} z C with all {m} in the sum"
    )
    print(
        f"{'epsilon':>8} {'z':>7} {'spent':>7} {'central':>8} {'distrib.':>8} "
        f"{'s central':>9} {'s distrib.':>10} {'s calib.':>8}"
    )
    for r in rows:
        dist = f"{r['dist']:.4f}" if "dist" in r else "-"
        s_dist = f"{r['s_dist']:.1f}" if "s_dist" in r else "-"
        print(
            f"{r['eps']:>8g} {r['z']:>7.4f} {r['spent']:>7.3f} {r['central']:>8.4f} {dist:>8} "
            f"{r['s_central']:>9.1f} {s_dist:>10} {r.get('s_calibrate', 0.0):>8.1f}"
        )
    print(f"\ntiers (high: clip + local DP z = {args.tier_z} + SecAgg; low: clip + SecAgg):")
    print(f"{'run':>22} {'accuracy':>8} {'seconds':>8}  per tier")
    for t in tiers:
        what = "all clients: clip + SecAgg, no noise"
        if t["summary"] is not None:
            high, low = t["summary"]["tiers"]["high"], t["summary"]["tiers"]["low"]
            what = (
                f"high {high['clients']} clients, local epsilon max "
                f"{high['local_epsilon_max']:.2f} median {high['local_epsilon_median']:.2f} "
                f"(of those sampled); low {low['clients']} clients, no epsilon"
            )
        print(f"{t['run']:>22} {t['acc']:>8.4f} {t['s']:>8.1f}  {what}")
    by_eps = {r["eps"]: r for r in rows}
    result: dict[str, float] = {
        "acc_eps1": by_eps[1.0]["central"],
        "acc_eps8": by_eps[8.0]["central"],
        "acc_nodp": by_eps[math.inf]["central"],
        "acc_eps2": by_eps[2.0]["central"],
        "acc_eps4": by_eps[4.0]["central"],
    }
    for r in rows:
        if "dist" in r:
            result[f"dist_minus_central_eps{r['eps']:g}"] = r["dist"] - r["central"]
    result["tiers_minus_notiers"] = tiers[1]["acc"] - tiers[0]["acc"]
    print("RESULT " + " ".join(f"{k}={v:.4f}" for k, v in result.items()))


if __name__ == "__main__":
    main()

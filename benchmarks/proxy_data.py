"""A server-held proxy set against label skew on pathological-shard MNIST: test
accuracy and rounds to target with and without it, at 100, 300 and 1,000 proxy
examples, for its two uses (``proxy:``, server/proxy.py): (a) ``tune``, one
epoch of SGD on the proxy set after every server step; (b) ``fill``, each
client short of classes given the proxy's rows of them (all of them: 8 of the
10 classes for a 2-shard client), their bytes counted in the downlink; and
``both``. Zhao et al. 2018 ("Federated Learning with Non-IID Data") report that
sharing 5% of the data globally recovers most of the accuracy label skew costs.

Setting: McMahan et al. 2017's non-IID 2NN row (100 clients of 2 label shards of
300 examples, C = 0.1, E = 1, B = 10, lr 0.1), every arm ``--rounds`` rounds
(25, what this shared machine affords) without stopping at a target, evaluated
every round; rounds to 90% and 95% read off the best-so-far curve
(interpolated, fedforge.evaluation.metrics).
The tuning uses the clients' own SGD: one epoch, B = 10, lr 0.1. The proxy rows
are carved from the training set (a seeded, class-balanced sample no client
then holds: each client loses the proxy rows its shards held); the baseline
``none`` keeps the whole partition. ``--quick``: 300 examples, 15 rounds.

Last line: ``RESULT proxy_none_rounds90=... proxy_<arm>_<size>_rounds90=...
proxy_<arm>_<size>_acc=...`` (accuracy after the last round; rounds nan when
the target was not reached), and ``proxy_fill_<size>_extra_mb`` (MB of proxy
rows shipped).

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/proxy_data.py [--quick]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch

from _common import add_workers, fmt, places, result_line, run_record, workers
from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data
from fedforge.evaluation.metrics import rounds_to_target
from fedforge.store import RunStore

ARMS = ("none", "tune", "fill", "both")
SIZES = (100, 300, 1000)


def config(arm: str, size: int, args: Any) -> Config:
    proxy: dict[str, Any] = {}
    if arm != "none":
        proxy = {"size": size, "tune_epochs": 1 if arm in ("tune", "both") else 0}
        proxy.update(tune_lr=0.1, tune_batch_size=10, fill_missing=arm in ("fill", "both"))
    name = "proxy-2nn-none" if arm == "none" else f"proxy-2nn-{arm}-{size}"
    return from_dict(
        {
            "name": name,
            "seed": 0,
            "model": "2nn",
            "num_clients": 100,
            "partition": {"kind": "shards", "shards_per_client": 2},
            "client_fraction": 0.1,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "rounds": args.rounds,
            "target_accuracy": None,
            "proxy": proxy,
            "workers": workers(args),
            "runs_dir": str(args.places.runs),
        }
    )


def figures(run_dir: str | Path, horizon: int) -> dict[str, Any]:
    """Rounds to 90% and 95%, the accuracy after round ``horizon``, and the MB sent
    down in rounds 1..``horizon``, of one run (NaN: it has not run that far)."""
    with RunStore.open(run_dir) as store:
        rounds = [r for r in store.rounds() if r.round_idx < horizon]
    evals = [(r.round_idx + 1, float(r.test_accuracy)) for r in rounds if r.test_accuracy]
    xs, accs = [x for x, _ in evals], [a for _, a in evals]
    down = sum(r.bytes_down for r in rounds)
    if len(rounds) < horizon:
        return figures_none()
    return {
        "rounds90": rounds_to_target(xs, accs, 0.90),
        "rounds95": rounds_to_target(xs, accs, 0.95),
        "acc": accs[-1] if accs else math.nan,
        "down_mb": down / 1e6,
    }


def figures_none() -> dict[str, Any]:
    """A cell with no run."""
    return dict.fromkeys(("rounds90", "rounds95", "acc", "down_mb"), math.nan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 examples, 15 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every arm (25)")
    parser.add_argument("--sizes", default=None, help="proxy sizes (100,300,1000)")
    parser.add_argument("--arms", default=",".join(ARMS), help="run only these arms")
    parser.add_argument(
        "--horizon",
        type=int,
        default=None,
        help="run nothing: read each cell's stored run over its first HORIZON rounds",
    )
    add_workers(parser)
    args = parser.parse_args()
    args.rounds = args.rounds or (15 if args.quick else 25)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else SIZES
    sizes = [300] if args.quick else sizes
    arms = args.arms.split(",")
    if set(arms) - set(ARMS):
        parser.error(f"--arms: allowed {', '.join(ARMS)}")
    args.places = places("proxy_data", args.quick)
    torch.set_num_threads(1)
    data = load_federated_data(config("none", 0, args))
    cells = [("none", 0)] if "none" in arms else []
    cells += [(a, s) for s in sizes for a in arms if a != "none"]  # interleaved by size
    got: dict[tuple[str, int], dict[str, Any]] = {}
    for arm, size in cells:
        cfg = config(arm, size, args)
        if args.horizon is None:
            rec = run_record(cfg, data, args.places)
            run_dir, status, horizon = rec["run_dir"], rec["status"], args.rounds
        else:  # the stores' first rounds, however far each run has gone (none resumed)
            found = sorted(args.places.runs.glob(f"*-{cfg.name}-*"))
            run_dir, status, horizon = (found[-1] if found else None), "read", args.horizon
        got[(arm, size)] = f = figures(run_dir, horizon) if run_dir else figures_none()
        print(
            f"{arm:>4} {size:>5}: rounds to 90% {fmt(f['rounds90'])}, to 95% "
            f"{fmt(f['rounds95'])}, accuracy {f['acc']:.4f}, {f['down_mb']:.1f} MB down "
            f"({status})",
            flush=True,
        )
    if set(arms) != set(ARMS):
        return  # a part of the work: the command without --arms prints RESULT
    result: dict[str, Any] = {
        "proxy_none_rounds90": got[("none", 0)]["rounds90"],
        "proxy_none_rounds95": got[("none", 0)]["rounds95"],
        "proxy_none_acc": got[("none", 0)]["acc"],
    }
    for arm in ARMS[1:]:
        for size in sizes:
            f = got[(arm, size)]
            result[f"proxy_{arm}_{size}_rounds90"] = f["rounds90"]
            result[f"proxy_{arm}_{size}_rounds95"] = f["rounds95"]
            result[f"proxy_{arm}_{size}_acc"] = f["acc"]
    for size in sizes:  # the proxy rows shipped: the fill arm's downlink over the baseline's
        extra = got[("fill", size)]["down_mb"] - got[("none", 0)]["down_mb"]
        result[f"proxy_fill_{size}_extra_mb"] = extra
    result.update(proxy_rounds=args.horizon or args.rounds)
    print(result_line(result))


if __name__ == "__main__":
    main()

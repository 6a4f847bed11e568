"""Membership inference on a small federation trained long, with and without central DP.

``dp_scale.py`` audits its models with the loss-threshold attack (Yeom et al.
2018) and finds nothing (AUC ~0.49): a 2NN trained on plenty of MNIST does not
overfit, so members and non-members have alike losses. Here the federation is
set up to overfit: few clients of few examples each (N = 100 clients of 10 MNIST
training rows, 1,000 members in all), every client in every round (q = 1), many
local epochs and rounds (E = 50, B = 10, lr 0.1, T = 30). The default model is
multinomial logistic regression (``logreg``, 7,850 parameters): the 2NN
(``--model 2nn``) costs about six times as much a run on a CPU, and its
199,210 coordinates take 25 times the noise power of central DP at the same z.

Arms, each on the same split and initial model of a seed:

- ``nodp``: plain FedAvg (no clipping, no noise);
- ``clip``: each client's delta clipped to a fixed C (``--clip``, 1.0;
  ``communication.clip_norm``), no noise: what clipping alone does;
- ``eps<e>``: central DP-FedAvg (McMahan et al. 2018), the same FIXED clip C and
  N(0, (z C)^2) on the sum, z from ``calibrate_noise`` (RDP, fixed-size cohorts,
  replace-one) for T rounds at q = 1 and delta = 1e-5 (``dp_scale.DELTA``), for
  epsilon 8 and 2 (``--eps``).

Each final model is audited: members are ALL training rows of the clients,
non-members as many MNIST test rows (``dp_scale.audit_losses``); the attack's
ROC AUC and best-threshold advantage, with a bootstrap of the AUC (members and
non-members resampled with replacement, ``--bootstrap`` draws: the draws'
standard deviation as the standard error, and the 2.5 and 97.5 percentiles). A
control, ``auc_heldout``: the same attack with non-members drawn from training
rows no client holds, the members' own distribution (the test set was written
by other people, so a model that merely fits the training set's writers better
scores above 0.5 against test rows). Also the test accuracy, the training
accuracy (on the members) and their gap, which Yeom et al. relate to the
attack's advantage. Over ``--seeds`` seeds (a new split, initial model and
noise each).

Last line ``RESULT mia_overfit_auc_<arm>= mia_overfit_auc_se_<arm>=
mia_overfit_adv_<arm>= mia_overfit_auc_heldout_<arm>= mia_overfit_acc_<arm>=
mia_overfit_gap_<arm>= ...`` (means over the seeds). ``--quick``: N = 20 clients
of 10, E = 5, T = 5, one seed, 100 bootstrap draws.

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/membership.py --quick
    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/membership.py --workers 2
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import torch

from _common import result_line
from dp_scale import DELTA, audit_losses, central_privacy
from fedforge.config import Config, from_dict
from fedforge.core.rng import numpy_rng
from fedforge.data.federated import FederatedData, load_federated_data
from fedforge.data.partition import Partition
from fedforge.evaluation.evaluate import evaluate
from fedforge.evaluation.membership import loss_threshold_attack, roc_auc
from fedforge.server.experiment import build
from fedforge.server.loop import run


def _config(
    args: argparse.Namespace, seed: int, privacy: dict[str, Any], clip: float | None = None
) -> Config:
    return from_dict(
        {
            "name": "membership-overfit",
            "seed": seed,
            "model": args.model,
            "engine": "vectorized",
            "num_clients": args.clients,
            "partition": {"kind": "iid"},
            "client_fraction": 1.0,
            "local_epochs": args.epochs,
            "batch_size": args.batch,
            "lr": args.lr,
            "rounds": args.rounds,
            "target_accuracy": None,
            "evaluation": {"every": args.rounds},
            "diagnostics": {"updates": False},
            "dtype": "float32",
            "privacy": {"delta": DELTA, **privacy},
            "communication": {"clip_norm": clip},
        }
    )


def small_clients(data: FederatedData, per_client: int) -> FederatedData:
    """``data`` with each client keeping the first ``per_client`` rows of its IID
    share (a random draw of the training set): the caller's own split."""
    part = Partition(tuple(np.asarray(ix)[:per_client] for ix in data.partition.client_indices))
    return dataclasses.replace(data, partition=part, split_by_config=False)


def bootstrap_auc(
    member_loss: torch.Tensor, nonmember_loss: torch.Tensor, draws: int, seed: int
) -> tuple[float, float, float]:
    """The AUC's bootstrap standard error and 95% percentile interval: members and
    non-members each resampled with replacement, ``draws`` times."""
    mem, non = -member_loss.numpy(), -nonmember_loss.numpy()
    rng = numpy_rng(seed, "membership_bootstrap")
    aucs = np.array(
        [
            roc_auc(rng.choice(mem, len(mem)), rng.choice(non, len(non)))
            for _ in range(max(2, draws))
        ]
    )
    lo, hi = np.percentile(aucs, [2.5, 97.5])
    return float(aucs.std(ddof=1)), float(lo), float(hi)


def _arm(args: argparse.Namespace, seed: int, arm: str) -> dict[str, float]:
    """One run of ``arm`` (``nodp``, ``clip`` or ``eps<e>``) and the attack on its
    final model."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    base = _config(args, seed, {})
    data = small_clients(load_federated_data(base), args.per_client)
    exp = build(base, data=data)
    out: dict[str, float] = {"z": 0.0, "spent": math.inf}
    priv: dict[str, Any] = {}
    if arm.startswith("eps"):
        priv, out["z"] = central_privacy(
            float(arm[3:]), args.rounds, 1.0, args.clients, args.clip, False
        )
    clip = args.clip if arm == "clip" else None  # the same clip as DP's, without noise
    res = run(_config(args, seed, priv, clip), data=data, store=False)
    if arm.startswith("eps"):
        out["spent"] = float(res.summary["privacy"]["epsilon"])
    mem_loss, non_loss = audit_losses(exp, data, res.params, None, seed)
    attack = loss_threshold_attack(mem_loss, non_loss)
    se, lo, hi = bootstrap_auc(mem_loss, non_loss, args.bootstrap, seed)
    rows = np.concatenate([np.asarray(ix) for ix in data.partition.client_indices])
    # the control: non-members from the training set's unused rows, the members'
    # own distribution (MNIST's test set was written by other people)
    unused = np.setdiff1d(np.arange(len(data.train_y)), rows)
    pool = (data.train_x[unused], data.train_y[unused])
    held = loss_threshold_attack(*audit_losses(exp, data, res.params, None, seed, pool))
    train = evaluate(exp.model, exp.spec, res.params, data.train_x[rows], data.train_y[rows])
    test = evaluate(exp.model, exp.spec, res.params, data.test_x, data.test_y)
    out.update(
        acc=test.accuracy,
        train_acc=train.accuracy,
        gap=train.accuracy - test.accuracy,
        train_loss=train.loss,
        test_loss=test.loss,
        auc=attack.auc,
        auc_se=se,
        auc_lo=lo,
        auc_hi=hi,
        adv=attack.advantage,
        auc_heldout=held.auc,
        adv_heldout=held.advantage,
        audited=float(attack.members),
        s=time.perf_counter() - t0,
    )
    print(f"seed {seed} {arm}: acc {test.accuracy:.4f} AUC {attack.auc:.4f}", flush=True)
    print(f"  heldout AUC {held.auc:.4f} train acc {train.accuracy:.4f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 20, E = 5, T = 5, one seed")
    parser.add_argument("--model", default="logreg", help="logreg or 2nn")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-client", type=int, default=10, help="training rows a client")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--clip", type=float, default=1.0, help="fixed clip norm C")
    parser.add_argument("--eps", type=float, nargs="+", default=[8.0, 2.0])
    parser.add_argument("--arms", nargs="+", help="a subset of nodp, clip, eps<e>")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--bootstrap", type=int, default=200, help="draws for the AUC's SE")
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel processes")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.epochs, args.rounds, args.seeds, args.bootstrap = 20, 5, 5, [0], 100
    arms = args.arms or ["nodp", "clip"] + [f"eps{e:g}" for e in args.eps]
    cells = [(seed, arm) for seed in args.seeds for arm in arms]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        outs = list(pool.map(_arm, [args] * len(cells), *zip(*cells, strict=True)))
    print(
        f"MNIST {args.model}, IID, N = {args.clients} clients of {args.per_client} training rows, "
        f"all clients every round, E = {args.epochs}, B = {args.batch}, lr {args.lr:g}, "
        f"T = {args.rounds}; DP arms: fixed clip C = {args.clip:g}, delta = {DELTA:g}; "
        f"attack on {outs[0]['audited']:.0f} members and as many test rows, "
        f"{args.bootstrap} bootstrap draws"
    )
    cols = ["z", "spent", "acc", "train_acc", "gap", "train_loss", "test_loss", "auc"]
    cols += ["auc_se", "auc_lo", "auc_hi", "adv", "auc_heldout", "adv_heldout", "s"]
    print(f"{'seed':>4} {'arm':>6} " + " ".join(f"{c:>9}" for c in cols))
    for (seed, arm), o in zip(cells, outs, strict=True):
        print(f"{seed:>4} {arm:>6} " + " ".join(f"{o[c]:>9.4f}" for c in cols))
    result: dict[str, Any] = {}
    for arm in arms:
        got = [o for (_, a), o in zip(cells, outs, strict=True) if a == arm]
        keys = ("auc", "auc_se", "adv", "auc_heldout", "acc", "gap")
        mean = {c: float(np.mean([o[c] for o in got])) for c in keys}
        if len(got) > 1:
            sd = float(np.std([o["auc"] for o in got], ddof=1))
            print(f"{arm}: AUC over {len(got)} seeds {mean['auc']:.4f} +- {sd:.4f} (sd)")
        for c, v in mean.items():
            result[f"mia_overfit_{c}_{arm}"] = v
    print(result_line(result))


if __name__ == "__main__":
    main()

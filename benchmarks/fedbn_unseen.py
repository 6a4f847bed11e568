"""FedBN (Li et al. 2021) on feature-shift MNIST with clients held out of
training: how clients never seen in training fare under the global batch norm
and under batch-norm statistics recomputed on their own data
(``fedforge.evaluation.unseen.recomputed_statistics``), and FedBN composed with
FedProx and with SCAFFOLD against FedBN on the clients that trained.

Setting: benchmarks/fedbn_shift.py's (MNIST, IID labels, each client's images
seen through one of six domains, model ``cnn_bn``, E = 1, B = 10, lr 0.1, each
client training on ``1 - holdout`` of its examples and scored on the rest in its
own domain). The clients are dealt their domains as there (``--quick``: 12 clients,
2 a domain; full: 30, 5 a domain), then some are held out of training:

- every client of ``--unseen-domain`` (default ``contrast``): an unseen DOMAIN;
- the lowest-numbered client of each of the two domains after it in fedbn_shift's
  list (cyclically): an unseen CLIENT of a domain other clients trained on.

The rest train, every one every round (C = 1), as a run of their own: the
federation is the training clients alone (so SCAFFOLD's 1/N and FedAvg's weights
are over them; the data are shifted and carved exactly as a run of all the
clients would, then the training clients' rows are given to the run).

Arms: ``fedavg``; ``fedbn``; ``fedbn_prox`` (``algorithm: fedprox``, mu =
``--mu``, with ``local_params.kinds: [batchnorm, buffer]``); ``fedbn_scaffold``
(``algorithm: scaffold``, option II, the same local_params). Training clients:
mean and worst accuracy from the run's own per-client evaluation (each with its
own batch norm under the FedBN arms). Held-out clients, scored here on their
held-out slice:

- ``global``: the run's global vector. FedAvg's batch norm is the average of the
  clients'; under the FedBN arms it is the INITIAL batch norm (never averaged),
  which is what fedforge gives a client it never trained;
- ``averaged`` (FedBN arms): the training clients' own batch-norm entries
  (affine weight and bias, running mean and variance) averaged, unweighted;
- ``recomputed``: the running mean and variance recomputed exactly on the
  held-out client's own training portion (labels unused), the affine
  parameters those of ``averaged`` (FedBN arms) or the global ones (FedAvg);
- ``recomputed_init`` (FedBN arms): the same statistics under the global
  (initial) affine parameters, gamma = 1 and beta = 0.

Contrast is chosen as the unseen domain because it is an affine map of pixel
values, which the first batch norm can undo (but for the zero padding at the
border): the case where recomputed statistics should help most. The unseen
clients of seen domains are the other case. ``--unseen-domain`` picks another.

Full mode: 30 clients, 100 rounds, runs recorded under
benchmarks/results/fedbn_unseen (reused by config match). ``--quick``: 12 clients,
holdout 0.95, 10 rounds, runs in a temporary directory. Either way the summary
(per-client accuracies of every variant, settings, machine) is written to
benchmarks/results/fedbn_unseen/{quick,full}_r<rounds>_<domain>.json.

Last line: ``RESULT fedbn_unseen_recomputed_minus_averaged=... ...`` (FedBN arm,
mean over all held-out clients), then each variant on the unseen domain
(``fedbn_newdomain_*``) and on unseen clients of seen domains (``fedbn_seendomain_*``)
for FedBN and FedAvg, the training clients' mean and worst accuracy of each arm
(``fedbn_train_*``) and the compositions' differences from FedBN.

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/fedbn_unseen.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import numpy as np
import torch

from _common import (
    ROOT,
    add_workers,
    machine,
    places,
    print_settings,
    result_line,
    run_record,
    save_record,
)
from fedbn_shift import DOMAINS
from fedbn_shift import config as shift_config
from fedforge.config import Config, override
from fedforge.core.params import ParamSpec
from fedforge.data.federated import FederatedData, load_federated_data, shift_data
from fedforge.data.partition import Partition
from fedforge.evaluation.clients import split_holdout, summarize_accuracies
from fedforge.evaluation.unseen import recomputed_statistics
from fedforge.models import build_model
from fedforge.store.final import load_final

LOCAL_BN = {"kinds": ["batchnorm", "buffer"]}
# arm: (algorithm, local_params)
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg": ("fedavg", {}),
    "fedbn": ("fedbn", {}),
    "fedbn_prox": ("fedprox", LOCAL_BN),
    "fedbn_scaffold": ("scaffold", LOCAL_BN),
}
VARIANTS = {
    "fedavg": ("global", "recomputed"),
    "fedbn": ("global", "averaged", "recomputed", "recomputed_init"),
}
EVAL_BATCH = 1000
RECORDS = ROOT / "benchmarks" / "results" / "fedbn_unseen"  # the summaries, both modes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="12 clients, 10 rounds")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--rounds", type=int, help="rounds of every arm (quick 10, full 100)")
    parser.add_argument("--mu", type=float, default=0.01, help="FedProx's mu (fedbn_prox)")
    parser.add_argument("--unseen-domain", default="contrast", choices=DOMAINS)
    add_workers(parser)
    args = parser.parse_args()
    if args.quick:  # one evaluation, at the end
        args.clients, rounds, args.holdout = 12, 10, 0.95
    else:
        args.clients, rounds, args.holdout = 30, 100, 0.9
    args.rounds = args.rounds or rounds
    args.eval_every = args.rounds if args.quick else min(10, args.rounds)
    args.places = places("fedbn_unseen", args.quick)
    torch.set_num_threads(1)
    return args


def held_out(domains: tuple[str, ...], unseen: str) -> dict[int, str]:
    """The held-out clients, each with its kind: every client of ``unseen``
    ('newdomain'), and the lowest-numbered client of each of the two domains after
    it in DOMAINS ('seendomain')."""
    out = {c: "newdomain" for c, d in enumerate(domains) if d == unseen}
    at = DOMAINS.index(unseen)
    for d in (DOMAINS[(at + 1) % len(DOMAINS)], DOMAINS[(at + 2) % len(DOMAINS)]):
        out[min(c for c, dd in enumerate(domains) if dd == d)] = "seendomain"
    return out


def arm_config(arm: str, seed: int, args: argparse.Namespace, clients: int) -> Config:
    """The run of ``arm`` over the ``clients`` training clients (data given, already
    shifted: fedbn_shift's setting without its partition)."""
    algorithm, local = ARMS[arm]
    changes: dict[str, Any] = {
        "name": f"fedbn-unseen-{args.unseen_domain}-{arm}-s{seed}",
        "num_clients": clients,
        "partition": dataclasses.asdict(Config().partition),
    }
    if algorithm == "fedprox":
        changes["fedprox"] = {"mu": args.mu}
    if local:
        changes["local_params"] = local
    return override(shift_config(algorithm, seed, args), changes)


class Scorer:
    """Accuracy of a cnn_bn parameter vector on a client's examples (eval mode)."""

    def __init__(self) -> None:
        self.model = build_model("cnn_bn", 0, torch.float32)
        self.spec = ParamSpec.of(self.model, include_buffers=True)

    def accuracy(self, vec: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
        self.spec.load_into(self.model, vec)
        self.model.eval()
        right = 0
        with torch.no_grad():
            for i in range(0, len(x), EVAL_BATCH):
                right += int(
                    (self.model(x[i : i + EVAL_BATCH]).argmax(1) == y[i : i + EVAL_BATCH]).sum()
                )
        return right / len(x)

    def recomputed(self, vec: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return recomputed_statistics(self.model, self.spec, vec, x, batch_size=EVAL_BATCH)


def vectors(arm: str, rec: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The vectors an unseen client could be given before its own statistics."""
    final = load_final(rec["run_dir"])
    params = final["params"].float()
    if arm == "fedavg":
        return {"global": params}
    personal = final["personal"]
    averaged = params.clone()
    averaged[personal["mask"]] = personal["rows"].float().mean(0)
    return {"global": params, "averaged": averaged}


def main() -> None:
    args = parse_args()
    t_start = time.perf_counter()
    scorer = Scorer()
    per_client: list[dict[str, Any]] = []  # one row per (seed, arm, held-out client, variant)
    train_rows: list[dict[str, Any]] = []  # one row per (seed, arm)
    for seed in range(args.seeds):
        whole = shift_config("fedavg", seed, args)  # all the clients, as fedbn_shift deals them
        data = shift_data(whole, load_federated_data(whole))
        assert data.domains is not None
        keep, held = split_holdout(data.partition, args.holdout, seed)
        out = held_out(data.domains, args.unseen_domain)
        train_ids = [c for c in range(args.clients) if c not in out]
        given = FederatedData(
            data.train_x,
            data.train_y,
            data.test_x,
            data.test_y,
            Partition(tuple(keep.client_indices[c] for c in train_ids)),
            holdout=Partition(tuple(held.client_indices[c] for c in train_ids)),
            domains=tuple(data.domains[c] for c in train_ids),
            num_classes=data.num_classes,
        )
        arms = {a: arm_config(a, seed, args, len(train_ids)) for a in ARMS}
        if seed == 0:
            print_settings("feature-shift MNIST, cnn_bn, clients held out", arms["fedbn"], arms)
            print(
                "held out (client: domain, kind): "
                + ", ".join(f"{c}: {data.domains[c]}, {k}" for c, k in sorted(out.items()))
                + f"; training clients: {len(train_ids)} of {args.clients}",
                flush=True,
            )
        for arm in ARMS:
            t0 = time.perf_counter()
            rec = run_record(arms[arm], given, args.places)
            acc = {int(c): float(a) for c, a, _loss, _n in rec["client_eval"]}
            s = summarize_accuracies(acc, worst=1)
            train_rows.append(
                dict(seed=seed, arm=arm, mean=s.mean, worst=s.worst[0][1], status=rec["status"])
            )
            kind = "fedavg" if arm == "fedavg" else "fedbn"
            vecs = vectors(arm, rec)
            for c, where in sorted(out.items()):
                x_own = data.train_x[torch.tensor(keep.client_indices[c])]
                idx = torch.tensor(held.client_indices[c])
                x, y = data.train_x[idx], data.train_y[idx]
                base = "averaged" if kind == "fedbn" else "global"
                cand = dict(vecs)
                cand["recomputed"] = scorer.recomputed(vecs[base], x_own)
                if kind == "fedbn":
                    cand["recomputed_init"] = scorer.recomputed(vecs["global"], x_own)
                for variant in VARIANTS[kind]:
                    per_client.append(
                        dict(
                            seed=seed,
                            arm=arm,
                            client=c,
                            domain=data.domains[c],
                            kind=where,
                            variant=variant,
                            accuracy=scorer.accuracy(cand[variant], x, y),
                            own_examples=len(x_own),
                            scored_examples=len(x),
                        )
                    )
            print(
                f"{arm} seed {seed}: {rec['status']}, {time.perf_counter() - t0:.0f} s",
                flush=True,
            )

    def unseen(arm: str, variant: str, kind: str | None = None) -> float:
        got = [
            r["accuracy"]
            for r in per_client
            if r["arm"] == arm and r["variant"] == variant and kind in (None, r["kind"])
        ]
        return float(np.mean(got)) if got else float("nan")

    def train(arm: str, key: str) -> float:
        return float(np.mean([r[key] for r in train_rows if r["arm"] == arm]))

    print("\nheld-out clients: accuracy on their held-out slice (mean over clients and seeds)")
    head = f"{'arm':>15} {'variant':>16} {'new domain':>10} {'seen domain':>11} {'all':>6}"
    print(head)
    print("-" * len(head))
    for arm in ARMS:
        for variant in VARIANTS["fedavg" if arm == "fedavg" else "fedbn"]:
            print(
                f"{arm:>15} {variant:>16} {unseen(arm, variant, 'newdomain'):>10.4f} "
                f"{unseen(arm, variant, 'seendomain'):>11.4f} {unseen(arm, variant):>6.4f}"
            )
    print(
        "\nper held-out client (seed 0): "
        + "; ".join(
            f"{r['arm']}/{r['variant']} c{r['client']} {r['domain']} {r['accuracy']:.3f}"
            for r in per_client
            if r["seed"] == 0 and r["arm"] in ("fedavg", "fedbn")
        )
    )
    print("\ntraining clients: accuracy on their held-out slices, own batch norm where kept")
    head = f"{'arm':>15} {'mean':>6} {'worst':>6}"
    print(head)
    print("-" * len(head))
    for arm in ARMS:
        print(f"{arm:>15} {train(arm, 'mean'):>6.4f} {train(arm, 'worst'):>6.4f}")

    result: dict[str, Any] = {
        "fedbn_unseen_recomputed_minus_averaged": unseen("fedbn", "recomputed")
        - unseen("fedbn", "averaged"),
        "fedbn_unseen_recomputed_minus_global": unseen("fedbn", "recomputed")
        - unseen("fedbn", "global"),
    }
    for kind in ("newdomain", "seendomain"):
        for arm in ("fedbn", "fedavg"):
            for variant in VARIANTS[arm]:
                tag = variant if arm == "fedbn" else f"fedavg_{variant}"
                result[f"fedbn_{kind}_{tag}"] = unseen(arm, variant, kind)
    for arm in ARMS:
        for key, name in (("mean", "mean"), ("worst", "worst_client")):
            result[f"fedbn_train_{arm}_{name}"] = train(arm, key)
    for arm in ("fedbn_prox", "fedbn_scaffold"):
        for key, name in (("mean", "mean"), ("worst", "worst_client")):
            result[f"fedbn_train_{arm[6:]}_minus_fedbn_{name}"] = train(arm, key) - train(
                "fedbn", key
            )
    result.update(
        fedbn_rounds=args.rounds,
        fedbn_clients=args.clients,
        fedbn_held_out=len(out),
        fedbn_seeds=args.seeds,
    )
    summary = {
        "settings": {
            "quick": args.quick,
            "rounds": args.rounds,
            "clients": args.clients,
            "holdout": args.holdout,
            "seeds": args.seeds,
            "mu": args.mu,
            "unseen_domain": args.unseen_domain,
            "arms": {a: c.name for a, c in arms.items()},
        },
        "held_out": per_client,
        "training": train_rows,
        "result": result,
        "seconds": time.perf_counter() - t_start,
        "machine": machine(),
    }
    mode = "quick" if args.quick else "full"
    path = RECORDS / f"{mode}_r{args.rounds}_{args.unseen_domain}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_record(path, summary)
    print(f"summary: {path} ({summary['seconds']:.0f} s)")
    print(result_line(result))


if __name__ == "__main__":
    main()

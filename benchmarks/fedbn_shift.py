"""FedBN vs FedAvg on feature-shift MNIST (issue 4): mean and worst-client
accuracy on the clients' own held-out data. Li et al. 2021 ("FedBN: Federated
Learning on Non-IID Features via Local Batch Normalization") report FedBN ahead
of FedAvg when clients' inputs differ in appearance; the issue expects FedBN
ahead on both figures.

Setting: MNIST, IID labels, each client's images seen through one domain of
``partition.feature_shift`` (rotation, invert, contrast, blur, noise, scale,
dealt over the clients in turn: data/shift.py); model ``cnn_bn`` (two 3x3
convolutions with batch norm); every client in every round (C = 1, as in the
FedBN paper's experiments); E = 1, B = 10, lr 0.1. ``evaluation.clients`` holds out
``evaluation.holdout`` of each client's data (0.9: the clients train on 10% of what
they hold, about 200 examples, as FedBN's experiments train each client on a
small slice) and scores every client on its held-out slice in its own domain:
FedAvg with the global model, FedBN with the global model under the client's own
batch-norm entries (clienteval.client_accuracies through
``Algorithm.personal.start``). The plain MNIST test set says little about FedBN
(its global batch-norm entries are the initial ones) and is shown only as a column.

Full mode: 30 clients (5 a domain), 100 rounds, per-client evaluation every 10
rounds; each run is recorded under benchmarks/results/fedbn_shift and a rerun of
the same command reuses or resumes it. ``--quick``: 12 clients (2 a domain),
evaluation.holdout 0.95 (about 250 training examples a client), 10 rounds, one
evaluation at the end.

Figures are from the last evaluation round. Last line: ``RESULT
fedbn_minus_fedavg_worst_client=... fedbn_minus_fedavg_mean=...`` (paired per
seed, averaged over seeds), then the 10th percentile's difference and each arm's
own figures.

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/fedbn_shift.py [--quick]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from _common import (
    add_workers,
    fmt,
    places,
    print_settings,
    result_line,
    run_record,
    seconds_per_round,
    workers,
)
from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data
from fedforge.data.shift import assign_domains
from fedforge.evaluation.clients import summarize_accuracies

DOMAINS = ["rotation", "invert", "contrast", "blur", "noise", "scale"]
ALGORITHMS = ("fedavg", "fedbn")


def config(algorithm: str, seed: int, args: Any) -> Config:
    return from_dict(
        {
            "name": f"fedbn-shift-{algorithm}-s{seed}",
            "seed": seed,
            "model": "cnn_bn",
            "algorithm": algorithm,
            "num_clients": args.clients,
            "partition": {"kind": "iid", "feature_shift": DOMAINS},
            "client_fraction": 1.0,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "rounds": args.rounds,
            "target_accuracy": None,
            "evaluation": {"every": args.eval_every, "clients": True, "holdout": args.holdout},
            "workers": workers(args),
            "runs_dir": str(args.places.runs),
        }
    )


def figures(rec: dict[str, Any], domains: tuple[str, ...]) -> dict[str, Any]:
    """Mean, p10, worst client (and its domain) and per-domain mean accuracy."""
    acc = {int(c): float(a) for c, a, _loss, _n in rec["client_eval"]}
    s = summarize_accuracies(acc, worst=1)
    worst_id, worst = s.worst[0]
    per_domain = {
        d: float(np.mean([a for c, a in acc.items() if domains[c] == d])) for d in DOMAINS
    }
    return dict(mean=s.mean, p10=s.p10, worst=worst, worst_domain=domains[worst_id], **per_domain)


def parse_args(bench: str, doc: str) -> argparse.Namespace:
    """The command line of a benchmark in this setting (``--quick``, ``--seeds``,
    ``--workers``), with the setting's sizes and ``bench``'s record places."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="12 clients, 10 rounds")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--rounds", type=int, help="rounds of every arm (quick 10, full 100)")
    add_workers(parser)
    args = parser.parse_args()
    rounds = args.rounds
    if args.quick:
        args.clients, args.rounds, args.eval_every, args.holdout = 12, 10, 10, 0.95
    else:
        args.clients, args.rounds, args.eval_every, args.holdout = 30, 100, 10, 0.9
    args.rounds = rounds or args.rounds
    args.places = places(bench, args.quick)
    torch.set_num_threads(1)
    return args


def main() -> None:
    args = parse_args("fedbn_shift", __doc__ or "")
    arms = {a: config(a, 0, args) for a in ALGORITHMS}
    print_settings("feature-shift MNIST, cnn_bn", arms["fedavg"], arms)
    rows: list[tuple[int, str, dict[str, Any], dict[str, Any]]] = []
    for seed in range(args.seeds):
        data = load_federated_data(config("fedavg", seed, args))
        domains = assign_domains(args.clients, DOMAINS, seed)  # as the run deals them
        for algorithm in ALGORITHMS:  # interleaved within a seed
            rec = run_record(config(algorithm, seed, args), data, args.places)
            rows.append((seed, algorithm, rec, figures(rec, domains)))
            print(f"{algorithm} seed {seed}: done ({rec['status']})", flush=True)
    print(
        f"per-client accuracy on held-out slices at round {rows[0][2]['client_eval_round'] + 1}; "
        f"clients trained: {len(rows[0][2]['clients_trained'])} of {args.clients}"
    )
    head = (
        f"{'algorithm':>9} {'seed':>4} {'mean':>6} {'p10':>6} {'worst':>6} {'(domain)':>9} "
        + " ".join(f"{d[:8]:>8}" for d in DOMAINS)
        + f" {'test':>6} {'s/round':>7}"
    )
    print(head)
    print("-" * len(head))
    for seed, algorithm, rec, f in rows:
        print(
            f"{algorithm:>9} {seed:>4} {f['mean']:>6.4f} {f['p10']:>6.4f} {f['worst']:>6.4f} "
            f"{f['worst_domain']:>9} "
            + " ".join(f"{f[d]:>8.4f}" for d in DOMAINS)
            + f" {fmt(rec['final_accuracy'], '.4f'):>6} {fmt(seconds_per_round(rec), '.2f'):>7}"
        )

    def paired(key: str) -> float:
        by = {(s, a): f[key] for s, a, _, f in rows}
        return float(np.mean([by[(s, "fedbn")] - by[(s, "fedavg")] for s in range(args.seeds)]))

    def own(algorithm: str, key: str) -> float:
        return float(np.mean([f[key] for _, a, _, f in rows if a == algorithm]))

    result: dict[str, Any] = {
        "fedbn_minus_fedavg_worst_client": paired("worst"),
        "fedbn_minus_fedavg_mean": paired("mean"),
        "fedbn_minus_fedavg_p10": paired("p10"),
    }
    for algorithm in ALGORITHMS:
        result[f"{algorithm}_mean"] = own(algorithm, "mean")
        result[f"{algorithm}_worst_client"] = own(algorithm, "worst")
    result.update(rounds=args.rounds, clients=args.clients, seeds=args.seeds)
    print(result_line(result))


if __name__ == "__main__":
    main()

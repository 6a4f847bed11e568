"""Clustered aggregation under a concept shift: per-cluster accuracy of clustered
FL (Sattler, Mueller, Samek 2020) and IFCA (Ghosh et al. 2020) against FedAvg,
and FedBN (Li et al. 2021) under concept shift and under label skew.

Setting: MNIST; ``partition.concept_shift`` G = 2 and 3 label maps (data/concept.py:
group 0 the identity, the others derangements of the ten classes, dealt over
the clients in turn), IID inputs; every client in every round (C = 1, as both
clustering papers run it); E = 1, B = 50, lr 0.1, the 2NN. Each client trains on
a fifth of what it holds (about 600 examples; ``evaluation.holdout`` 0.8, which
keeps the runs affordable on a shared machine) and is scored on the rest, in its
own labelling: FedAvg with the one global model, CFL and IFCA with the client's
cluster's model (``group_eval`` attribute ``cluster``). One model cannot fit two
labellings of the same digits: FedAvg's per-client accuracy is bounded by about
1 / G of what a model per group reaches.

CFL: ``mean_norm_below`` 0.4, ``max_norm_above`` 0.8, ``max_cross_cosine`` 0,
``warmup_rounds`` 5 (the defaults); IFCA: ``clusters`` = G (the paper gives it the
true k). Both merge models within relative distance 0.01.

FedBN arms: model ``cnn_bn``, B = 10, lr 0.01, each client training on a tenth of what it
holds (``evaluation.holdout`` 0.9, as benchmarks/fedbn_shift.py), FedAvg and FedBN
on (a) the same concept shift with G = 2 and (b) label skew (pathological shards,
two classes a client) with no concept shift. Li et al. say FedBN is for feature
shift and does not address label or concept shift.

Figures are each arm's last evaluation: per-client accuracy mean and worst, the
number of clusters, and their purity (the share of clients whose cluster's
majority label map is their own). Full mode: 20 clients, 30 rounds (2NN) and 15
rounds (cnn_bn), evaluation every 5 rounds. ``--quick``: 10 clients, 6 and 2 rounds.

Last line: ``RESULT cluster_...`` (keys below).

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/clustered.py [--quick]
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import numpy as np
import torch

from _common import fmt, places, print_settings, result_line, run_record, seconds_per_round
from fedforge.config import Config, from_dict
from fedforge.data.concept import assign_groups
from fedforge.data.federated import load_federated_data
from fedforge.evaluation.clients import summarize_accuracies

CLUSTERED = ("fedavg", "cfl", "ifca")
# the FedBN arms' step (FedBN's paper trains with SGD at 0.01); at 0.1 the cnn_bn on
# shards of two classes stalled for both arms (loss flat at 1.87, one class predicted)
BN_LR = 0.01
GROUPS = (2, 3)


def config(name: str, algorithm: str, partition: dict[str, Any], args: Any, **more: Any) -> Config:
    options = {"ifca": {"clusters": partition.get("concept_shift") or 2}}
    return from_dict(
        {
            "name": name,
            "seed": 0,
            "model": "2nn",
            "algorithm": algorithm,
            "num_clients": args.clients,
            "partition": partition,
            "client_fraction": 1.0,
            "local_epochs": 1,
            "batch_size": 50,
            "lr": 0.1,
            "rounds": args.rounds,
            "target_accuracy": None,
            "evaluation": {"every": args.eval_every, "clients": True, "holdout": 0.8},
            "plugin_options": options if algorithm == "ifca" else {},
            "runs_dir": str(args.places.runs),
            **more,
        }
    )


def bn_config(algorithm: str, shift: str, args: Any) -> Config:
    partition: dict[str, Any] = (
        {"kind": "iid", "concept_shift": 2} if shift == "concept" else {"kind": "shards"}
    )
    cfg = config(f"clustered-bn-{shift}-{algorithm}", algorithm, partition, args)
    return from_dict(
        {
            **_plain(cfg),
            "model": "cnn_bn",
            "batch_size": 10,
            "lr": BN_LR,
            "rounds": args.bn_rounds,
            "evaluation": {"every": args.eval_every, "clients": True, "holdout": 0.9},
        }
    )


def _plain(cfg: Config) -> dict[str, Any]:
    from fedforge.config import to_dict

    return to_dict(cfg)


def figures(rec: dict[str, Any], concepts: tuple[int, ...] | None) -> dict[str, Any]:
    acc = {int(c): float(a) for c, a, _loss, _n in rec["client_eval"]}
    s = summarize_accuracies(acc, worst=1)
    out: dict[str, Any] = {"mean": s.mean, "worst": s.worst[0][1], "clusters": 1, "purity": None}
    table = cluster_table(rec)
    if table is not None and concepts is not None:
        out["clusters"] = len(set(table.values()))
        majority = {
            k: Counter(concepts[c] for c, j in table.items() if j == k).most_common(1)[0][0]
            for k in set(table.values())
        }
        out["purity"] = float(np.mean([majority[j] == concepts[c] for c, j in table.items()]))
    return out


def cluster_table(rec: dict[str, Any]) -> dict[int, int] | None:
    """Each client's cluster as the final checkpoint's table holds it."""
    from fedforge.store.final import load_final

    state = load_final(rec["run_dir"]).get("personal")
    if not isinstance(state, dict) or "cluster_of" not in state:
        return None
    return {c: int(j) for c, j in enumerate(state["cluster_of"].tolist())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 clients, 6 and 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.rounds, args.bn_rounds, args.eval_every = 10, 6, 2, 2
    else:
        args.clients, args.rounds, args.bn_rounds, args.eval_every = 20, 30, 15, 5
    args.places = places("clustered", args.quick)
    torch.set_num_threads(1)
    result: dict[str, Any] = {}
    rows = []
    for g in GROUPS:
        part = {"kind": "iid", "concept_shift": g}
        arms = {a: config(f"clustered-g{g}-{a}", a, part, args) for a in CLUSTERED}
        print_settings(f"concept shift, {g} label maps, 2nn", arms["fedavg"], arms)
        data = load_federated_data(arms["fedavg"])
        concepts = assign_groups(args.clients, g, 0)
        for a, cfg in arms.items():
            rec = run_record(cfg, data, args.places)
            f = figures(rec, concepts)
            rows.append((f"{a} G={g}", rec, f))
            result[f"cluster_{a}_g{g}_mean"] = f["mean"]
            result[f"cluster_{a}_g{g}_worst"] = f["worst"]
            if a != "fedavg":
                result[f"cluster_{a}_g{g}_clusters"] = f["clusters"]
                result[f"cluster_{a}_g{g}_purity"] = f["purity"]
    for shift in ("concept", "labelskew"):
        arms = {a: bn_config(a, shift, args) for a in ("fedavg", "fedbn")}
        print_settings(f"FedBN under {shift}, cnn_bn", arms["fedavg"], arms)
        data = load_federated_data(arms["fedavg"])
        for a, cfg in arms.items():
            rec = run_record(cfg, data, args.places)
            f = figures(rec, None)
            rows.append((f"{a} cnn_bn {shift}", rec, f))
            result[f"cluster_bn_{shift}_{a}_mean"] = f["mean"]
        result[f"cluster_bn_{shift}_fedbn_minus_fedavg"] = (
            result[f"cluster_bn_{shift}_fedbn_mean"] - result[f"cluster_bn_{shift}_fedavg_mean"]
        )
    head = f"{'arm':>24} {'mean':>6} {'worst':>6} {'clusters':>8} {'purity':>6} {'s/round':>7}"
    print(head)
    print("-" * len(head))
    for name, rec, f in rows:
        print(
            f"{name:>24} {f['mean']:>6.4f} {f['worst']:>6.4f} {f['clusters']:>8} "
            f"{fmt(f['purity'], '.2f'):>6} {fmt(seconds_per_round(rec), '.2f'):>7}"
        )
    result.update(
        cluster_clients=args.clients, cluster_rounds=args.rounds, cluster_bn_rounds=args.bn_rounds
    )
    print(result_line(result))


if __name__ == "__main__":
    main()

"""Accuracy reached under a byte budget (``communication.byte_budget``), dense
against top-k uploads, and the top-k uploads' index overlap (the
``index_overlap`` round diagnostic).

Setting: MNIST, 2NN, IID, 100 clients, C = 0.1, E = 1, B = 10, lr 0.1, float32,
evaluated every round. Three arms, each run once until the largest budget stops
it (the stop rule itself: the run ends at the round whose bytes moved, up +
down, reach it, and that round is evaluated):

- ``dense``: dense uploads and payloads (about 0.8 MB each way a client);
- ``topk``: top-k uploads with k = 1% of the coordinates (Aji & Heafield 2017)
  and error feedback (Stich et al. 2018), dense payloads: the payload then
  carries almost all of a round's bytes, so top-k at most halves them;
- ``topk_int8``: the same uploads, int8 payloads (a quarter of the downlink).

The accuracy a smaller budget B reaches is read from the same curve: the test
accuracy of the first round whose cumulative bytes reach B, which is what a run
stopped by ``byte_budget: B`` ends with (runs are deterministic under the seed,
and the stopped round is evaluated). Budgets: 16, 32, 64 and 128 MB (10^6
bytes). ``--quick``: 20 clients, C = 0.25, budgets of 4 and 8 MB.

Last line: ``RESULT budget_<arm>_acc_<B>mb=...`` for each arm and budget, the
rounds each arm ran under the largest budget, and the top-k arm's mean pair
overlap of the uploads' index sets over its rounds with the overlap of random
sets of the same size (``budget_topk_overlap``, ``budget_topk_chance``).

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/byte_budget.py [--quick]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import torch

from _common import Places, _comparable, _same_config, places, print_settings, result_line
from fedforge.config import Config, from_dict
from fedforge.data.federated import load_federated_data
from fedforge.server.sweep import run_point
from fedforge.store import RunStore

MB = 10**6
ARMS: dict[str, dict[str, Any]] = {
    "dense": {},
    "topk": {"uplink": "topk", "fraction": 0.01, "error_feedback": True},
    "topk_int8": {
        "uplink": "topk",
        "fraction": 0.01,
        "error_feedback": True,
        "downlink": "int8",
        "rounding": "nearest",
    },
}


def config(arm: str, args: Any) -> Config:
    return from_dict(
        {
            "name": f"byte-budget-{arm}",
            "model": "2nn",
            "num_clients": args.clients,
            "client_fraction": args.fraction,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "rounds": 1000,  # a cap: the budget stops every arm first
            "target_accuracy": None,
            "engine": "serial",
            "threads": 1,
            "checkpoint_every": 0,
            "communication": {**ARMS[arm], "byte_budget": max(args.budgets) * MB},
            "runs_dir": str(args.places.runs),
        }
    )


def arm_record(cfg: Config, data: Any, where: Places) -> dict[str, Any]:
    """Each round's test accuracy, cumulative bytes and index overlap (reused when
    the recorded config is this one)."""
    where.records.mkdir(parents=True, exist_ok=True)
    path = where.records / f"{cfg.name}.json"
    if path.exists():
        rec: dict[str, Any] = json.loads(path.read_text())
        if _same_config(rec.get("config"), cfg):
            return rec
    point = run_point(cfg, {}, data, progress=False)
    if point.run_dir is None:
        raise SystemExit(f"{cfg.name}: stopped by a signal; rerun the same command")
    with RunStore.open(point.run_dir) as store:
        rounds, summary = store.rounds(), store.summary() or {}
        overlap = store.read_rows("index_overlap")
    moved = np.cumsum([r.bytes_up + r.bytes_down for r in rounds]).tolist()
    rec = {
        "config": _comparable(cfg),
        "accuracy": [r.test_accuracy for r in rounds],
        "moved": moved,
        "overlap": [list(o) for o in overlap],
        "byte_stop": summary.get("byte_stop"),
        "wall_seconds": summary.get("wall_seconds"),
    }
    path.write_text(json.dumps(rec, indent=1))
    return rec


def reached(rec: dict[str, Any], budget: int) -> tuple[float | None, int | None]:
    """The accuracy and round a run stopped by ``budget`` bytes ends with."""
    for r, (acc, moved) in enumerate(zip(rec["accuracy"], rec["moved"], strict=True)):
        if moved >= budget:
            return acc, r + 1
    return None, None  # not reached within the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 clients, budgets 4 and 8 MB")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.fraction, args.budgets = 20, 0.25, [4, 8]
    else:
        args.clients, args.fraction, args.budgets = 100, 0.1, [16, 32, 64, 128]
    args.places = places("byte_budget", args.quick)
    torch.set_num_threads(1)
    arms = {a: config(a, args) for a in ARMS}
    print_settings("MNIST 2NN IID under a byte budget", arms["dense"], arms)
    data = load_federated_data(arms["dense"])
    recs = {a: arm_record(cfg, data, args.places) for a, cfg in arms.items()}
    result: dict[str, Any] = {}
    head = f"{'arm':>10} {'MB/round':>8} " + " ".join(f"{b:>5}MB (rnd)" for b in args.budgets)
    print(head)
    print("-" * len(head))
    for arm, rec in recs.items():
        cells = []
        for b in args.budgets:
            acc, r = reached(rec, b * MB)
            result[f"budget_{arm}_acc_{b}mb"] = acc
            cells.append(f"{acc:.4f} ({r:>3})" if acc is not None else "     -      ")
        per_round = rec["moved"][-1] / len(rec["moved"]) / MB
        print(f"{arm:>10} {per_round:>8.2f} " + " ".join(f"{c:>12}" for c in cells))
        result[f"budget_{arm}_rounds"] = len(rec["moved"])
        print(f"  {arm}: {rec['byte_stop']}")
    rows = recs["topk"]["overlap"]  # (round, clients, kept, pair, chance, union, common)
    pair = [r[3] for r in rows if r[3] is not None]
    result["budget_topk_overlap"] = float(np.mean(pair)) if pair else None
    result["budget_topk_chance"] = float(np.mean([r[4] for r in rows])) if rows else None
    result["budget_topk_union"] = float(np.mean([r[5] for r in rows])) if rows else None
    if pair:
        print(
            f"topk index overlap over {len(pair)} rounds: pair overlap mean {np.mean(pair):.4f} "
            f"(first {pair[0]:.4f}, last {pair[-1]:.4f}; random sets "
            f"{result['budget_topk_chance']:.4f}); kept by any upload "
            f"{result['budget_topk_union']:.4f} of the coordinates"
        )
    print(result_line(result))


if __name__ == "__main__":
    main()

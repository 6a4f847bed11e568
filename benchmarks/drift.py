"""FedAvg and FedProx tracking a concept drift: the labels change at round
boundaries, and the test set is scored on the current phase's labels.

Setting: MNIST, the 2NN, 100 IID clients (the drift is the only shift), C = 0.1,
E = 1, B = 10, client lr 0.1, ``--rounds`` (40) rounds evaluated every round;
``drift: {kind: label_map, every: --every (10), groups: 2}``: rounds 0-9 read the
labels as they are, 10-19 through a derangement of the classes drawn from the
seed, 20-29 as they are again, and so on (config/drift.py). Arms: ``fedavg``,
``prox0.01`` and ``prox0.1`` (``algorithm: fedprox``, ``fedprox.mu`` 0.01, 0.1).

At each phase change (round c, from 0): ``before`` is the accuracy after round
c - 1 (the old phase's last, on its labels); ``drop`` the accuracy after round
c (one round trained on the new labels, scored on them); ``recover`` the rounds
from c until the accuracy is back within ``--within`` (0.02) of ``before``
(1: the first round already is; nan: not within the phase); ``end`` the
accuracy after the phase's last round. Each figure is the mean over the
changes and the seeds. ``--quick``: 12 rounds, phases of 4, one seed.
``--kind label_mix``: the label proportions move instead (``drift.strength``
4: the phase's five classes each 4 times as likely as another; the runs and
the RESULT keys named ``drift_mix_...``). ``--split shards``: McMahan's
pathological split instead of IID (200 shards of 300 sorted by label, 2 a
client), where client drift and the concept drift add up; the runs and the
RESULT keys carry ``shards`` (``drift_shards_...``, ``drift_mix_shards_...``).

Last line: ``RESULT drift_before_<arm>=... drift_drop_<arm>=...
drift_recover_<arm>=... drift_end_<arm>=... drift_every=... drift_rounds=...
drift_seeds=...``

    FEDFORGE_PROBE=off OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data \
        nice -n 10 python benchmarks/drift.py --workers 1 [--quick] [--seeds 2]

(``FEDFORGE_PROBE=off``: ``engine: auto`` takes its static rule, the vectorised
engine for the 2NN, where a probe on a loaded machine may pick the serial one;
either computes the same.)
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch

from _common import add_workers, fmt, mean_of, places, print_settings, result_line, run_arms
from _common import workers as workers_of
from fedforge.config import Config, from_dict

# --split: its partition
SPLITS: dict[str, dict[str, Any]] = {
    "iid": {"kind": "iid"},
    "shards": {"kind": "shards", "shards_per_client": 2},
}

# arm: the settings it adds to FedAvg
ARMS: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "prox0.01": {"algorithm": "fedprox", "fedprox": {"mu": 0.01}},
    "prox0.1": {"algorithm": "fedprox", "fedprox": {"mu": 0.1}},
}


def config(arm: str, seed: int, args: Any) -> Config:
    return from_dict(
        {
            "name": f"{prefix(args, '-')}-{arm}-s{seed}-e{args.every}-r{args.rounds}",
            "seed": seed,
            "model": "2nn",
            "num_clients": 100,
            "partition": SPLITS[args.split],
            "client_fraction": 0.1,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "rounds": args.rounds,
            "target_accuracy": None,
            "evaluation": {"every": 1},
            "drift": {"kind": args.kind, "every": args.every, "groups": 2},
            "workers": workers_of(args),
            "runs_dir": str(args.places.runs),
            **ARMS[arm],
        }
    )


def prefix(args: Any, sep: str) -> str:
    """The runs' and RESULT keys' prefix: ``drift``, ``drift_mix`` for label_mix,
    each followed by ``_shards`` on the pathological split."""
    base = "drift" if args.kind == "label_map" else f"drift{sep}mix"
    return base if args.split == "iid" else f"{base}{sep}shards"


def phase_changes(curve: list[list[float]], every: int, within: float) -> list[dict[str, float]]:
    """Each phase change's before, drop, recover and end figures from a run's
    curve of (round from 1, accuracy), evaluated every round."""
    acc = {int(r) - 1: float(a) for r, a in curve}  # by round index from 0
    rounds = len(acc)
    out = []
    for c in range(every, rounds, every):
        last = min(c + every, rounds) - 1
        before = acc[c - 1]
        back = next((r for r in range(c, last + 1) if acc[r] >= before - within), None)
        out.append(
            {
                "before": before,
                "drop": acc[c],
                "recover": math.nan if back is None else float(back - c + 1),
                "end": acc[last],
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="12 rounds, phases of 4, one seed")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="rounds a phase lasts")
    parser.add_argument("--within", type=float, default=0.02, help="recovered: this close")
    parser.add_argument("--kind", choices=["label_map", "label_mix"], default="label_map")
    parser.add_argument("--split", choices=sorted(SPLITS), default="iid")
    add_workers(parser)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.every, args.seeds = 12, 4, 1
    args.places = places("drift", args.quick)
    torch.set_num_threads(1)
    arms = {a: config(a, 0, args) for a in ARMS}
    title = f"MNIST 2NN {args.split}, drift {args.kind} every {args.every} rounds"
    print_settings(title, arms["fedavg"], arms)
    rows = run_arms(list(ARMS), config, args, "fedavg")
    result: dict[str, Any] = {}
    for arm in ARMS:
        changes = [
            ch
            for a, _, rec in rows
            if a == arm
            for ch in phase_changes(rec["curve"], args.every, args.within)
        ]
        for i, ch in enumerate(changes):
            shown = ", ".join(f"{k} {fmt(v, '.4f')}" for k, v in ch.items())
            print(f"{arm} change {i + 1}: {shown}")
        for key in ("before", "drop", "recover", "end"):
            name = f"{prefix(args, '_')}_{key}_{arm.replace('.', '')}"
            result[name] = mean_of([ch[key] for ch in changes])
    for key, value in (("every", args.every), ("rounds", args.rounds), ("seeds", args.seeds)):
        result[f"{prefix(args, '_')}_{key}"] = value
    print(result_line(result))


if __name__ == "__main__":
    main()

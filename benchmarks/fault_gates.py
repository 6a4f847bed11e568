"""Faults that come and go, under plain FedAvg: which intake gate catches a
client's uint8 upload, and what accuracy the run keeps (minutes on two cores).

The 2NN on 10 IID clients holding MNIST's first 6,000 training images (the data
of practice_robust.py; the 10,000 test images score), all of them every round
(C = 1, E = 1, B = 20, lr 0.1), ROUNDS rounds, seed 0; one client (attack
fraction 0.1) is faulty:

- ``uint8_values``: its update min-max quantised to uint8 and sent as floats
  0..255, the model's length (well formed: no form check sees it), every round
  (p = 1) or in about half the rounds by its seeded schedule (p = 0.5);
- ``uint8``: the uint8 bytes read as floats, a quarter of the length, p = 0.5.

Each fault runs with the default gates, with each norm bound off
(``max_update_ratio``, ``max_norm_multiple``), with both off, with both off and
the robust z-score ``norm_gate`` (3.5) on, and with both off and the client's
own ``client_gate`` on. Per arm: the final test accuracy, the faulty uploads
refused over those sent (``caught``), and the gate that refused them.

    FEDFORGE_DATA=/path/to/data OMP_NUM_THREADS=1 python benchmarks/fault_gates.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _common import places, result_line, save_record
from fedforge.config import Config, override
from fedforge.data.federated import FederatedData
from fedforge.robust.attacks import attacker_ids, faulty
from fedforge.server.loop import run
from practice_robust import _cfg, _data

OFF = {"robust.max_update_ratio": None, "robust.max_norm_multiple": None}
GATES: dict[str, dict[str, Any]] = {
    "default": {},
    "no_ratio": {"robust.max_update_ratio": None},
    "no_multiple": {"robust.max_norm_multiple": None},
    "none": OFF,
    "norm_gate": {**OFF, "robust.norm_gate": 3.5},
    "client_gate": {**OFF, "robust.client_gate": True},
}
FAULTS = {"uint8_values": ("uint8_values", 1.0), "uint8_values_p05": ("uint8_values", 0.5),
          "uint8_p05": ("uint8", 0.5)}  # fmt: skip
CAUGHT_BY = (
    ("robust.max_update_ratio", "max_update_ratio"),
    ("robust.max_norm_multiple", "max_norm_multiple"),
    ("norm_gate", "norm_gate"),
    ("withheld", "client_gate"),
    ("has shape", "form"),
)


def _gate(why: str) -> str:
    return next((name for key, name in CAUGHT_BY if key in why), "other")


def _arm(base: Config, data: FederatedData, fault: str | None, gates: dict[str, Any]) -> dict:
    changes: dict[str, Any] = dict(gates)
    if fault is not None:
        kind, p = FAULTS[fault]
        changes.update({"robust.attack": kind, "robust.attack_fraction": 0.1,
                        "robust.attack_probability": p})  # fmt: skip
    cfg = override(base, changes)
    res = run(cfg, data=data, progress=False, store=False)
    acc = next(r.test_accuracy for r in reversed(res.rounds) if r.test_accuracy is not None)
    out: dict[str, Any] = {"acc": 100.0 * acc, "rounds": len(res.rounds)}
    if fault is not None:
        (bad,) = attacker_ids(cfg.num_clients, 0.1, cfg.seed)
        p = cfg.robust.attack_probability
        sent = [r for r in range(len(res.rounds)) if faulty(frozenset({bad}), p, cfg.seed, r, bad)]
        refused = {r: why for r, c, why in res.rejected if c == bad}
        out["faulty_rounds"] = sent
        out["caught"] = sum(r in refused for r in sent) / len(sent) if sent else float("nan")
        out["by"] = sorted({_gate(refused[r]) for r in sent if r in refused})
        out["others_refused"] = sum(c != bad for _, c, _ in res.rejected)
    return out


def measure(quick: bool) -> dict[str, Any]:
    rounds = 3 if quick else 8
    base = override(_cfg(), {"rounds": rounds, "evaluation.every": rounds})
    data = _data()
    t0 = time.perf_counter()
    arms: dict[str, Any] = {"honest": _arm(base, data, None, {})}
    for fault in FAULTS:
        for gate, changes in GATES.items():
            arms[f"{fault}_{gate}"] = a = _arm(base, data, fault, changes)
            print(f"{fault:18s} {gate:12s} acc {a['acc']:6.2f}%  caught {a['caught']:.2f} "
                  f"by {','.join(a['by']) or '-'}  (faulty rounds {a['faulty_rounds']}, "
                  f"honest refused {a['others_refused']})", flush=True)  # fmt: skip
    arms["seconds"] = time.perf_counter() - t0
    arms["rounds"] = rounds
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 8")
    args = parser.parse_args()
    arms = measure(args.quick)
    where = places("fault_gates", args.quick).records
    where.mkdir(parents=True, exist_ok=True)
    save_record(where / "arms.json", arms)
    fields: dict[str, Any] = {"faults_honest_acc": arms["honest"]["acc"]}
    for fault in FAULTS:
        for gate in GATES:
            a = arms[f"{fault}_{gate}"]
            fields[f"faults_{fault}_{gate}_acc"] = a["acc"]
            fields[f"faults_{fault}_{gate}_caught"] = a["caught"]
    print(result_line(fields))


if __name__ == "__main__":
    main()

"""Seconds per round of the Shakespeare LSTM (FedAvg E=1 B=10, C=0.1, by role):
fedforge's serial engine beside plain PyTorch doing the same work (the same
cohort's clients, each trained from the global model with torch.optim.SGD over its
windows in minibatches of 10, then the example-weighted mean), side by side in
one process, alternating, so both see the same machine.

    python benchmarks/lstm_round.py --rounds 3 --threads 2

Last line: ``RESULT lstm_s_per_round=... plain_s_per_round=... overhead=...``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

from fedforge import config as config_mod
from fedforge.data.federated import load_federated_data
from fedforge.server.experiment import build
from fedforge.server.loop import run
from fedforge.server.round import sample
from fedforge.server.state import LoopState
from fedforge.tasks.losses import token_cross_entropy

ROOT = Path(__file__).resolve().parent.parent


def plain_round(
    model: torch.nn.Module, clients: list[tuple[torch.Tensor, torch.Tensor]], lr: float
) -> None:
    """One FedAvg round in plain PyTorch: each client from the global model, one
    epoch of SGD in batches of 10 (a fixed order: timing, not accuracy), then the
    example-weighted mean written back into ``model``."""
    total = sum(len(y) for _, y in clients)
    mean = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    for x, y in clients:
        local = copy.deepcopy(model)
        opt = torch.optim.SGD(local.parameters(), lr=lr)
        for start in range(0, len(y), 10):
            loss = token_cross_entropy(local(x[start : start + 10]), y[start : start + 10]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        for k, v in local.state_dict().items():
            mean[k] += v * (len(y) / total)
    model.load_state_dict(mean)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir")
    args = p.parse_args(argv)
    os.environ.setdefault("FEDFORGE_PROBE", "off")
    fields: dict[str, object] = {
        "engine": "serial",
        "threads": args.threads,
        "evaluation": {"every": 10**6},  # training only: evaluation is not part of the comparison
        "target_accuracy": None,
    }
    if args.data_dir:
        fields["data_dir"] = args.data_dir
    cfg = config_mod.override(
        config_mod.load(ROOT / "configs" / "shakespeare_noniid_e1_b10.yaml"), fields
    )
    # a test set of one window: the run's closing evaluation costs nothing
    full = load_federated_data(cfg)
    data = dataclasses.replace(full, test_x=full.test_x[:1], test_y=full.test_y[:1])
    exp = build(cfg, data)
    ours, plain = [], []
    for r in range(args.rounds):
        one = config_mod.override(cfg, {"rounds": 1, "seed": r})
        t0 = time.perf_counter()
        run(one, data=data, store=False)
        ours.append(time.perf_counter() - t0)
        cohort = sample(build(one, data), LoopState.fresh(exp).next_round)
        clients = [data.client_data(c) for c in cohort]
        model = copy.deepcopy(exp.model)
        torch.set_num_threads(args.threads)
        t0 = time.perf_counter()
        plain_round(model, clients, cfg.lr)
        plain.append(time.perf_counter() - t0)
        print(f"round {r}: fedforge {ours[-1]:.2f} s, plain {plain[-1]:.2f} s", flush=True)
    a, b = min(ours), min(plain)
    print(f"RESULT lstm_s_per_round={a:.2f} plain_s_per_round={b:.2f} overhead={a / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

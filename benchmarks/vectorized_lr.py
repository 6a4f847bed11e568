"""The vectorised engine with a learning rate per client: one chunk for the
cohort against one chunk per client, side by side.

With ``local.lr_rule`` every client of a round may have its own lr. The
vectorised engine trains them in one chunk (each client's lr folded into its
step: engines/batched_mlp.py, algorithms/local.py ``sgd_step_``); before, a
chunk held only clients of one lr, so under ``data_size`` (a distinct lr for
nearly every client) it trained them one at a time.

Setting: MNIST, the 2NN, 100 clients of a quantity-skew split (lognormal sigma
1), E = 1, B = 10, lr 0.1, ``local.lr_rule: data_size``; the first round of a
cohort of clients 0-9 (C = 0.1) and of clients 0-49 (C = 0.5; ``--quick``: only
the first), trained from the same start by:
  one_chunk       the vectorised engine's ``run_cohort`` on the whole cohort,
  per_client      the same engine given one client at a time (what a chunk a
                  lr amounted to),
  uniform         the whole cohort at the plan's lr (no rule): the engine's
                  speed without per-client rates,
  serial          the serial engine on the cohort, with the rule.
Each is timed ``--repeats`` (7; ``--quick`` 2) times, interleaved, one thread;
the figure is the median seconds. The updates of one_chunk and per_client are
compared too (max abs difference of the decoded deltas, float32, times 1e6).
That the two compute the same is tests/test_vectorized_client_lr.py's (float64,
1e-9); here the difference is float32 rounding, which a client training near
the edge of stability amplifies: in the cohort of 50, clients with lr 0.39-0.40
and 270-570 steps end up to 8.5 apart, and the serial and vectorised engines
at one lr of 0.4 differ by as much (2.0-3.2) on the same clients.

Last line, for each cohort size c: ``RESULT vec_lr_c<c>_one_chunk_s=...
vec_lr_c<c>_per_client_s=... vec_lr_c<c>_uniform_s=... vec_lr_c<c>_serial_s=...
vec_lr_c<c>_speedup=<per_client / one_chunk> vec_lr_c<c>_vs_uniform=<one_chunk /
uniform> vec_lr_c<c>_max_diff_e6=...``

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/vectorized_lr.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from _common import result_line
from fedforge.config import Config, from_dict, override
from fedforge.core import wire
from fedforge.data.federated import load_federated_data
from fedforge.server.experiment import build
from fedforge.server.round import configure
from fedforge.server.state import LoopState


def config() -> Config:
    """The setting; each way of training overrides its engine and lr rule."""
    return from_dict(
        {
            "name": "vectorized-lr",
            "model": "2nn",
            "num_clients": 100,
            "partition": {"kind": "quantity", "sigma": 1.0},
            "client_fraction": 0.1,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.1,
            "workers": 1,
            "threads": 1,
        }
    )


def timed(cfg: Config, data: Any, cohort: list[int], repeats: int) -> dict[str, float]:
    """The median seconds of each way to train ``cohort``'s round, and the max abs
    difference of the one-chunk and per-client updates."""
    runs: dict[str, Callable[[], list[Any]]] = {}
    for name, engine, rule in (
        ("one_chunk", "vectorized", True),
        ("uniform", "vectorized", False),
        ("serial", "serial", True),
    ):
        changes = {"engine": engine, "local.lr_rule": "data_size" if rule else None}
        exp = build(override(cfg, changes), data)
        orders = configure(exp, LoopState.fresh(exp), 0, 0, cohort)
        tasks, payload, eng = orders.tasks, orders.payload, exp.engine
        runs[name] = lambda e=eng, t=tasks, p=payload: list(e.run_cohort(t, p))
        if name == "one_chunk":
            lrs = sorted({t.plan.lr for t in tasks})
            print(
                f"cohort of {len(cohort)}: {len(lrs)} distinct lrs, {lrs[0]:.4f} .. {lrs[-1]:.4f}"
            )
            runs["per_client"] = lambda e=eng, t=tasks, p=payload: [
                u for task in t for u in e.run_cohort([task], p)
            ]
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    ups: dict[str, list[Any]] = {}
    for _ in range(repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            ups[name] = fn()
            seconds[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(s) for name, s in seconds.items()}
    for name, s in med.items():
        print(f"  {name:<12} {s:.3f} s  ({', '.join(f'{x:.3f}' for x in seconds[name])})")
    delta = {
        name: {u.client_id: wire.decode(u.data).tensors["delta"] for u in ups[name]}
        for name in ("one_chunk", "per_client")
    }
    med["max_diff"] = max(
        float((delta["one_chunk"][c] - delta["per_client"][c]).abs().max()) for c in cohort
    )
    print(f"  max abs difference of the updates, one chunk vs per client: {med['max_diff']:.3g}")
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a cohort of 10, 2 repeats")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = config()
    data = load_federated_data(cfg)
    fields: dict[str, float] = {}
    for size in (10,) if args.quick else (10, 50):
        med = timed(cfg, data, list(range(size)), 2 if args.quick else args.repeats)
        key = f"vec_lr_c{size}"
        for name in ("one_chunk", "per_client", "uniform", "serial"):
            fields[f"{key}_{name}_s"] = med[name]
        fields[f"{key}_speedup"] = med["per_client"] / med["one_chunk"]
        fields[f"{key}_vs_uniform"] = med["one_chunk"] / med["uniform"]
        fields[f"{key}_max_diff_e6"] = med["max_diff"] * 1e6
    print(result_line(fields))


if __name__ == "__main__":
    main()

"""``engine: ray`` on this machine: against the pool engine, its driver's memory,
its object-store traffic, a 100,000-client population, float64 equivalence,
a projection to a cluster, and Flower's Ray simulation beside it.

    FEDFORGE_DATA=/work/shared/data python benchmarks/ray_engine.py           # full
    FEDFORGE_DATA=/work/shared/data python benchmarks/ray_engine.py --quick   # a minute

Workload (McMahan et al.'s MNIST setting): IID, N = 1,000 clients of 60
examples, E = 1, B = 10, lr 0.1, float32, the 2NN and the CNN, cohorts 10, 100
and 1,000 (client_fraction 0.01 / 0.1 / 1.0).

- **Throughput** (one process, one local Ray cluster of this machine's 2 CPUs
  started once): ``engine: ray`` (``ray.workers: 2``, ``num_cpus: 1``, partial
  aggregation on the workers, the default) against the pool engine
  (``engine: serial``, ``workers: 2``: two forked processes), the two runs
  alternated (pool, ray, then ray, pool, ...), each run of ``rounds`` rounds
  timed from the loop's own round records: the first round is a warm-up
  (workers start, and Ray's first round sends each upload, its norm bound
  waiting for the round's median) and the last evaluates the test set, so both
  are left out. Samples per second = the cohort's training examples over the
  round's seconds. Per-round overhead = round seconds minus the clients'
  summed training seconds (as each worker timed them) / workers: what the round
  costs beyond perfect division of its clients' work. One point with the
  partial aggregation off (each upload travels to the driver).
- **Driver memory and traffic** (each point a fresh subprocess with its own Ray
  cluster): the driver's peak RSS (``VmHWM``, reset through
  ``/proc/self/clear_refs`` after the warm-up round, read before the last,
  evaluating round starts) over the timed rounds, its RSS after the warm-up,
  and the bytes the driver receives back from the workers a round (each
  returned object pickled, as Ray serialises it) against the model's bytes
  x workers; the payload it puts once a round.
- **Population**: 10,000 and 100,000 clients of one MNIST row each, drawn
  from the same 100,000-row training set (MNIST's 60,000 rows, then its first
  40,000 again; rows past the last client are held by no one), so that the two
  runs hold the same tensors and differ in the population only; 2NN, a
  1,000-client cohort: seconds per round and the driver's memory, with what
  the driver keeps per client (the partition's index arrays, the selection
  history's rows) measured.
- **Equivalence**: a small float64 run (2NN, 100 MNIST clients, C = 0.1),
  ``engine: ray`` with partial aggregation against ``engine: serial``: the max
  abs difference of the final parameters.
- **Projection**: from the measured per-client seconds, per-round overhead and
  the driver's merge per worker share.
- **Flower**: benchmarks/flower_baseline.py run by /work/flwr-venv/bin/python
  (Flower's Ray simulation, the same workload), when both exist.

Last line: ``RESULT ray_vs_pool_cnn= ray_vs_pool_2nn= ray_driver_mib_1000=
ray_driver_mib_100k= ray_equiv_maxdiff= ray_vs_flower_1000=`` (ray_vs_pool_* at
cohort 100, the median of the paired per-repetition ratios of samples/s;
driver MiB: peak RSS over the timed rounds of the 2NN at cohort 1,000 of
N = 1,000, and of the 100,000-client population; ray_vs_flower_1000: Flower's
2NN seconds per round over ours at cohort 1,000). ``--memory``: the driver's
memory points alone (memory does not need a quiet machine), last line
``RESULT ray_driver_mib_100= ray_driver_mib_1000= ray_driver_mib_100k=``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, machine, result_line  # noqa: E402  (benchmarks/ is no package)
from fedforge.config import from_dict  # noqa: E402
from fedforge.data.federated import FederatedData, load_federated_data  # noqa: E402
from fedforge.data.partition import Partition  # noqa: E402
from ray_meter import WORKERS, Meter, instrument, run_timed, status_kib  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FLOWER_PY = Path("/work/flwr-venv/bin/python")
FLOWER_SCRIPT = ROOT / "benchmarks" / "flower_baseline.py"


def base(model: str, cohort: int, rounds: int, engine: str, **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "dataset": "mnist",
        "model": model,
        "num_clients": 1000,
        "partition": {"kind": "iid"},
        "client_fraction": cohort / 1000,
        "local_epochs": 1,
        "batch_size": 10,
        "lr": 0.1,
        "dtype": "float32",
        "rounds": rounds,
        "evaluation": {"every": rounds},
        "target_accuracy": None,
        "checkpoint_every": 0,
        "seed": 0,
    }
    if engine == "pool":
        d |= {"engine": "serial", "workers": WORKERS}
    else:
        d |= {"engine": "ray", "ray": {"workers": WORKERS, "num_cpus": 1}}
    d.update(kw)
    return d


# -- the throughput table: pool and ray alternated in this process --


def throughput(model: str, cohort: int, rounds: int, reps: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"pool": [], "ray": []}
    for rep in range(reps):
        order = ("pool", "ray") if rep % 2 == 0 else ("ray", "pool")
        for engine in order:
            r = run_timed(base(model, cohort, rounds, engine))
            r.pop("final")
            runs[engine].append(r)
            print(
                f"  {model} cohort {cohort} rep {rep} {engine:>4} ({r['engine']}): "
                f"{r['s_per_round']:.2f} s/round, {r['samples_per_s']:.0f} samples/s, "
                f"overhead {r['overhead_s']:.3f} s",
                flush=True,
            )
    ratios = [
        r["samples_per_s"] / p["samples_per_s"]
        for r, p in zip(runs["ray"], runs["pool"], strict=True)
    ]

    def med(engine: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[engine])

    keys = ("s_per_round", "samples_per_s", "overhead_s", "beyond_busiest_s", "client_s_each",
            "merge_s_per_share", "clients_per_share")  # fmt: skip
    return {
        "ratio": statistics.median(ratios),
        **{f"{e}_{k}": med(e, k) for e in ("pool", "ray") for k in keys},
    }


# -- subprocess points: the driver's memory, the traffic, the population --


def population(clients: int, rows: int) -> FederatedData:
    """``clients`` clients of one row each (client c: row c) of a training set of
    ``rows`` rows (MNIST's 60,000 repeated to length): the same tensors whatever
    the population, rows past the last client held by no one."""
    cfg = from_dict({"dataset": "mnist", "num_clients": 1000, "dtype": "float32"})
    mnist = load_federated_data(cfg)
    take = torch.arange(rows) % len(mnist.train_y)
    x, y = mnist.train_x[take].contiguous(), mnist.train_y[take].contiguous()
    part = Partition(tuple(np.arange(clients, dtype=np.int64).reshape(clients, 1)))
    return FederatedData(x, y, mnist.test_x, mnist.test_y, part)


def partition_bytes(data: FederatedData) -> int:
    return sum(sys.getsizeof(a) for a in data.partition.client_indices) + sys.getsizeof(
        data.partition.client_indices
    )


def point(spec: dict[str, Any]) -> dict[str, Any]:
    """One measured run in this (fresh) process: ``spec`` = the config and, for a
    population, its size."""
    import ray

    Meter.count_bytes = True
    ray.init(num_cpus=WORKERS, include_dashboard=False, logging_level="ERROR")
    data = None
    extra: dict[str, Any] = {}
    if spec.get("population"):
        data = population(spec["population"], spec["rows"])
        extra["partition_mib"] = partition_bytes(data) / 2**20
    extra["before_run_mib"] = status_kib("VmRSS") / 1024
    try:
        out = run_timed(spec["cfg"], data, memory=True)
    finally:
        ray.shutdown()
    out.pop("final")
    return out | extra


def subprocess_point(spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--point", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    if proc.returncode != 0:
        raise SystemExit(f"point {spec} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def equivalence(quick: bool) -> float:
    """Max abs difference of the final parameters, ray (partial aggregation on)
    against serial, in float64."""
    kw = {
        "dtype": "float64",
        "num_clients": 100,
        "client_fraction": 0.1,
        "evaluation": {"every": 1},
    }
    rounds = 3 if quick else 5
    serial = run_timed(base("2nn", 10, rounds, "pool", **kw) | {"workers": 1})["final"]
    ray = run_timed(base("2nn", 10, rounds, "ray", **kw))["final"]
    return float((ray - serial).abs().max())


def flower(quick: bool) -> tuple[dict[str, float], str]:
    """Flower's RESULT fields, or none and why."""
    if not FLOWER_PY.exists():
        return {}, f"{FLOWER_PY} not found"
    if not FLOWER_SCRIPT.exists():
        return {}, f"{FLOWER_SCRIPT.relative_to(ROOT)} not in this tree"
    cohorts, rounds = ("100", "1") if quick else ("100,1000", "3")
    cmd = [str(FLOWER_PY), str(FLOWER_SCRIPT), "--model", "2nn", "--cohorts", cohorts]
    cmd += ["--rounds", rounds]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # its own venv, not fedforge's
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode != 0 or not last.startswith("RESULT"):
        return {}, f"{' '.join(cmd)} failed (rc {proc.returncode}): {proc.stderr[-300:]!r}"
    print(f"flower_baseline.py: {last}", flush=True)
    fields = {}
    for kv in last.split()[1:]:
        k, _, v = kv.partition("=")
        try:
            fields[k] = float(v)
        except ValueError:
            fields[k] = math.nan
    return fields, "ran"


def projection(table: dict[tuple[str, int], dict[str, Any]]) -> dict[int, float]:
    """1,000 clients over M machines of 2 workers (W = 2M), from this machine's
    figures: round = ceil(1000 / W) x a client's training + the fixed per-round
    overhead (the round beyond its busiest worker at cohort 10) + the driver's
    merge, W x (per share) + 1000 x (per client's verdict), the two merge terms
    fitted to the merge times at the smallest and the largest cohort."""
    model = "cnn" if ("cnn", 1000) in table else "2nn"
    cohorts = sorted(c for m, c in table if m == model)
    small, large = table[model, cohorts[0]], table[model, cohorts[-1]]
    client_s = large["ray_client_s_each"]
    fixed = small["ray_beyond_busiest_s"]
    n0, n1 = small["ray_clients_per_share"], large["ray_clients_per_share"]
    m0, m1 = small["ray_merge_s_per_share"], large["ray_merge_s_per_share"]
    per_client = max(0.0, (m1 - m0) / (n1 - n0)) if n1 > n0 else 0.0
    per_share = max(0.0, m0 - per_client * n0)
    print(
        f"\nProjection ({model}, 1,000 clients, machines of {WORKERS} workers, W workers): "
        f"round = ceil(1000 / W) x {client_s:.4f} s (a client's training, cohort "
        f"{cohorts[-1]}) + {fixed:.3f} s (round beyond its busiest worker, cohort {cohorts[0]}) "
        f"+ W x {per_share * 1e3:.2f} ms (merge a share) + 1000 x {per_client * 1e3:.3f} ms "
        "(book a client's verdict); the payload's broadcast to the machines is not measured here"
    )
    out = {}
    for machines in (1, 10, 100):
        w = WORKERS * machines
        out[machines] = math.ceil(1000 / w) * client_s + fixed + w * per_share + 1000 * per_client
        print(f"  {machines} machines ({w} workers): {out[machines]:.2f} s/round")
    return out


def memory(q: bool) -> tuple[dict[str, dict[str, Any]], int, tuple[int, int]]:
    """The driver's memory and traffic, each point its own process and cluster:
    the points, the largest cohort and the two populations."""
    big = 100 if q else 1000
    mem_rounds = 3 if q else 5
    points: dict[str, dict[str, Any]] = {}
    for cohort in (10, big) if q else (100, 1000):
        points[f"cohort {cohort}"] = subprocess_point(
            {"cfg": base("2nn", cohort, mem_rounds, "ray")}
        )
    points["cohort 100, aggregation off"] = subprocess_point(
        {"cfg": base("2nn", 100, mem_rounds, "ray", ray={"workers": WORKERS, "num_cpus": 1,
                                                         "aggregate_on_workers": False})}
    )  # fmt: skip
    pops = (2000, 20000) if q else (10000, 100000)
    pop_cohort = 100 if q else 1000
    for n in pops:
        cfg = base("2nn", pop_cohort, mem_rounds, "ray", num_clients=n,
                   client_fraction=pop_cohort / n)  # fmt: skip
        points[f"population {n}"] = subprocess_point({"cfg": cfg, "population": n, "rows": pops[1]})
    print("\nDriver memory (MiB) and traffic per round (2NN, engine: ray, 2 workers)")
    print("| point | s/round | RSS before run | RSS after warm-up | peak over timed rounds "
          "| anon at end | back to driver / round | model x workers | payload put / round "
          "| history rows | history JSON KiB | partition MiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, m in points.items():
        print(
            f"| {name} | {m['s_per_round']:.2f} | {m['before_run_mib']:.0f} "
            f"| {m['after_warmup_mib']:.0f} | {m['peak_mib']:.0f} | {m['anon_mib']:.0f} "
            f"| {m['back_bytes'] / 1e6:.2f} MB | {m['model_bytes'] * WORKERS / 1e6:.2f} MB "
            f"| {m['put_bytes'] / 1e6:.2f} MB | {m['history_rows']} "
            f"| {m['history_bytes'] / 1024:.0f} | {fmt(m.get('partition_mib'), '.1f')} |"
        )

    return points, big, pops


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-flower", action="store_true")
    p.add_argument("--memory", action="store_true", help="the driver's memory points only")
    p.add_argument("--point", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    instrument()
    if args.point:
        print(json.dumps(point(json.loads(args.point))), flush=True)
        return 0
    import ray

    q = args.quick
    print(json.dumps(machine()), flush=True)
    if args.memory:  # memory does not depend on a quiet machine; time does
        points, big, pops = memory(q)
        print(
            result_line(
                {
                    f"ray_driver_mib_{c}": points[f"cohort {c}"]["peak_mib"]
                    for c in ((10, big) if q else (100, 1000))
                }
                | {"ray_driver_mib_100k": points[f"population {pops[1]}"]["peak_mib"]}
            )
        )
        return 0
    # cohort -> (rounds per run, repetitions); the CNN at 1,000: one timed round
    plan = {10: (4, 1), 100: (3, 1)} if q else {10: (8, 2), 100: (5, 2), 1000: (4, 1)}
    models = ["2nn"] if q else ["2nn", "cnn"]
    ray.init(num_cpus=WORKERS, include_dashboard=False, logging_level="ERROR")
    table: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        for model in models:
            for cohort, (rounds, reps) in plan.items():
                if model == "cnn" and cohort == 1000:
                    rounds = 3
                table[model, cohort] = throughput(model, cohort, rounds, reps)
        off = run_timed(base("2nn", 100, 3 if q else 5, "ray", ray={"workers": WORKERS,
                        "num_cpus": 1, "aggregate_on_workers": False}))  # fmt: skip
        print(f"  2nn cohort 100 ray, partial aggregation off: {off['samples_per_s']:.0f} "
              f"samples/s, overhead {off['overhead_s']:.3f} s", flush=True)  # fmt: skip
        maxdiff = equivalence(q)
    finally:
        ray.shutdown()

    print("\nThroughput (medians over repetitions; ray/pool: median of the paired ratios)")
    print("| model | cohort | pool samples/s | ray samples/s | ray/pool | pool s/round "
          "| ray s/round | pool overhead s | ray overhead s | ray beyond busiest worker s "
          "| client s (60 ex.) | driver merge / share | clients / share |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (model, cohort), t in table.items():
        print(
            f"| {model} | {cohort} | {t['pool_samples_per_s']:.0f} | {t['ray_samples_per_s']:.0f} "
            f"| {t['ratio']:.2f} | {t['pool_s_per_round']:.2f} | {t['ray_s_per_round']:.2f} "
            f"| {t['pool_overhead_s']:.3f} | {t['ray_overhead_s']:.3f} "
            f"| {t['ray_beyond_busiest_s']:.3f} | {t['ray_client_s_each']:.4f} "
            f"| {t['ray_merge_s_per_share'] * 1e3:.2f} ms | {t['ray_clients_per_share']:.0f} |"
        )
    print(f"2nn cohort 100, partial aggregation off: {off['samples_per_s']:.0f} samples/s, "
          f"overhead {off['overhead_s']:.3f} s/round (on: "
          f"{table['2nn', 100]['ray_samples_per_s']:.0f}, "
          f"{table['2nn', 100]['ray_overhead_s']:.3f})")  # fmt: skip

    points, big, pops = memory(q)
    projection(table)
    fl, why = ({}, "--no-flower") if args.no_flower else flower(q)
    top = max(c for m, c in table if m == "2nn")  # 1,000 (--quick: 100)
    ours_1000 = table["2nn", top]["ray_s_per_round"]
    fl_1000 = fl.get(f"flower_2nn_s_per_round_{top}", math.nan)
    if not fl:
        print(f"Flower: n/a ({why})")
    print(
        result_line(
            {
                "ray_vs_pool_cnn": table["cnn", 100]["ratio"] if ("cnn", 100) in table else None,
                "ray_vs_pool_2nn": table["2nn", 100]["ratio"],
                "ray_driver_mib_1000": points[f"cohort {big}"]["peak_mib"],
                "ray_driver_mib_100k": points[f"population {pops[1]}"]["peak_mib"],
                "ray_equiv_maxdiff": f"{maxdiff:.2e}",
                "ray_vs_flower_1000": fl_1000 / ours_1000 if fl else None,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

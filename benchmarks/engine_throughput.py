"""Engine throughput: serial and vectorised engines against plain PyTorch.

    python benchmarks/engine_throughput.py            # full: 5 blocks per model
    python benchmarks/engine_throughput.py --quick    # 1 block, fewer clients

On the same samples (MNIST, 100 IID clients, one round's cohort: C=0.1, E=1,
B=10) and for the 2NN and the CNN, measures samples/second of:
  central_b   plain PyTorch training at batch B on the round's samples,
  central_kb  the same at batch K*B (the machine's limit for that work),
  serial      the serial engine over the cohort,
  vectorized  the vectorised engine over the cohort,
interleaved (one of each per block, blocks repeated) with ratios paired within
a block: this machine's speed drifts by up to a third over tens of minutes.
Then seconds per round with evaluation, and a scaling table (2NN, clients of
60 samples, cohorts of 10, 100, 1000: seconds per round and peak RSS, each in
a fresh subprocess). Last line: RESULT with the headline ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fedforge import config as config_mod
from fedforge.algorithms import cross_entropy
from fedforge.client import ClientTask
from fedforge.evaluate import evaluate
from fedforge.experiment import build, load_federated_data
from fedforge.models import build_model
from fedforge.server.sampling import sample_cohort
from fedforge.transport import wire

ROOT = Path(__file__).resolve().parent.parent


def central(model_name: str, x: torch.Tensor, y: torch.Tensor, batch: int) -> float:
    """Seconds for one epoch of plain PyTorch SGD over (x, y) at ``batch``, in the
    fastest fp32 layout (channels_last for the CNN)."""
    model = build_model(model_name, 0)
    if model_name == "cnn":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for idx in perm.split(batch):
        opt.zero_grad(set_to_none=True)
        cross_entropy(model(x[idx]), y[idx]).mean().backward()
        opt.step()
    return time.perf_counter() - t0


def engine_round(cfg: config_mod.Config, data: object, engine: str) -> tuple[float, int]:
    """Seconds of one round's client work on ``engine``, and the samples trained."""
    exp = build(config_mod.override(cfg, {"engine": engine}), data)  # type: ignore[arg-type]
    cohort = sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, 0)
    plan = exp.algorithm.plan(0)
    payload = wire.encode({"params": exp.initial_params})
    tasks = [ClientTask(c, 0, plan, cfg.seed) for c in cohort]
    t0 = time.perf_counter()
    for _ in exp.engine.run_cohort(tasks, payload):
        pass
    samples = sum(exp.data.num_examples(c) for c in cohort) * cfg.local_epochs
    return time.perf_counter() - t0, samples


def measure_model(model_name: str, blocks: int, clients: int) -> dict[str, float]:
    cfg = config_mod.Config(
        model=model_name, num_clients=clients, client_fraction=0.1, local_epochs=1,
        batch_size=10, target_accuracy=None,
    )  # fmt: skip
    data = load_federated_data(cfg)
    cohort = sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, 0)
    idx = torch.cat([torch.tensor(data.partition.client_indices[c]) for c in cohort])
    x, y = data.train_x[idx], data.train_y[idx]
    k = len(cohort)
    runs: dict[str, Callable[[], float]] = {
        "central_b": lambda: len(y) / central(model_name, x, y, 10),
        "central_kb": lambda: len(y) / central(model_name, x, y, 10 * k),
        "serial": lambda: _rate(engine_round(cfg, data, "serial")),
        "vectorized": lambda: _rate(engine_round(cfg, data, "vectorized")),
    }
    for fn in runs.values():  # warm-up (allocator, vmap tracing)
        fn()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(blocks):
        for name, fn in runs.items():
            rates[name].append(fn())
    out = {f"{name}": statistics.median(r) for name, r in rates.items()}
    for a, b in (("vectorized", "central_kb"), ("vectorized", "serial"), ("serial", "central_b")):
        out[f"{a}_vs_{b}"] = statistics.median(
            ra / rb for ra, rb in zip(rates[a], rates[b], strict=True)
        )
    exp = build(cfg, data)
    t0 = time.perf_counter()
    evaluate(exp.model, exp.spec, exp.initial_params, data.test_x, data.test_y)
    out["eval_s"] = time.perf_counter() - t0
    return out


def _rate(result: tuple[float, int]) -> float:
    seconds, samples = result
    return samples / seconds


def scaling_point(cohort: int, engine: str) -> dict[str, float]:
    """Rounds of a 2NN federation of 1,000 clients of 60 samples with a cohort of
    ``cohort`` clients, in a fresh subprocess so that its peak RSS is its own."""
    code = (
        "import json,time,resource,sys;from fedforge import config as c;"
        "from fedforge.server.loop import run;"
        f"cfg=c.Config(model='2nn',num_clients=1000,client_fraction={cohort / 1000},batch_size=10,"
        f"rounds=2,target_accuracy=None,eval_every=2,engine='{engine}');"
        "t=time.perf_counter();r=run(cfg,store=False);"
        "print(json.dumps({'s_per_round':(time.perf_counter()-t)/2,"
        "'peak_mib':resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--models", default="2nn,cnn")
    p.add_argument("--scaling", default="10,100,1000")
    args = p.parse_args(argv)
    blocks = 1 if args.quick else args.blocks
    results = {m: measure_model(m, blocks, 100) for m in args.models.split(",") if m}
    cols = ["central_b", "central_kb", "serial", "vectorized"]
    print(f"{'model':<6}" + "".join(f"{c:>12}" for c in cols) + "   samples/s (median of blocks)")
    for m, r in results.items():
        print(f"{m:<6}" + "".join(f"{r[c]:>12.0f}" for c in cols))
    print(
        f"{'model':<6}{'vec/central_kb':>16}{'vec/serial':>12}{'serial/central_b':>18}{'eval s':>8}"
    )
    for m, r in results.items():
        print(
            f"{m:<6}{r['vectorized_vs_central_kb']:>16.2f}{r['vectorized_vs_serial']:>12.2f}"
            f"{r['serial_vs_central_b']:>18.2f}{r['eval_s']:>8.2f}"
        )
    scaling = [] if args.quick else [int(c) for c in args.scaling.split(",")]
    peak = float("nan")
    if scaling:
        print(f"{'cohort':>7}{'engine':>12}{'s/round':>10}{'peak MiB':>10}")
        for c in scaling:
            for engine in ("serial", "vectorized"):
                pt = scaling_point(c, engine)
                print(f"{c:>7}{engine:>12}{pt['s_per_round']:>10.2f}{pt['peak_mib']:>10.0f}")
                if c == max(scaling) and engine == "vectorized":
                    peak = pt["peak_mib"]
    fields = []
    for m, r in results.items():
        fields.append(f"vec_vs_central_kb_{m}={r['vectorized_vs_central_kb']:.2f}")
        fields.append(f"vec_vs_serial_{m}={r['vectorized_vs_serial']:.2f}")
    fields.append(f"peak_mib_{max(scaling) if scaling else 0}={peak:.0f}")
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())

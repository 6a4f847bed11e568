"""Engine throughput: fedforge's engines against plain PyTorch, side by side.

    python benchmarks/engine_throughput.py            # full: 3 blocks, scaling, default job
    python benchmarks/engine_throughput.py --quick    # 1 block, no scaling, no default job

On the same samples (MNIST, 100 IID clients, one round's cohort: C=0.1, E=1,
B=10) and for the 2NN and the CNN, samples/second of:
  central_b     plain PyTorch (nn.Module + torch.optim.SGD) at batch B, one
                process with every core as intra-op threads,
  central_b_mp  the same work split over one single-threaded process per core,
  central_b_each  plain PyTorch at batch B in one single-threaded process per
                core, each on its share: per-client training with these kernels,
                so central_b_each / central_kb is the ceiling of an engine that
                trains every client at B on its own weights (per_client_ceiling),
  central_kb    plain PyTorch at batch K*B (the machine's limit for that work),
                the better of one multi-threaded process and one process per core,
  serial, vectorized            the engines in one process (threads = cores),
  serial_w, vectorized_w        the same spread over one worker per core,
  bf16_w        (CNN) serial_w with ``precision: bf16``,
  central_kb_bf16  (CNN) central_kb under bf16 autocast: what bf16 gives this
                work on this CPU when the batch is K*B (central_bf16_vs_fp32).
The CNN runs channels_last everywhere (the fastest fp32 layout here). Every
figure is measured once per block, blocks repeated (interleaved), and ratios
are paired within a block: this machine's speed drifts by up to a third over
tens of minutes. "engine" is what ``engine: auto`` with ``workers: 0`` runs:
for the 2NN the vectorised engine in one process (its fused path, all cores
as threads), for the CNN the serial engine over 2 workers, not the vectorised
one, so the RESULT keys ``vec_vs_central_kb_cnn`` and ``vec_vs_serial_cnn``
(the issue's names) measure the engine a run takes, whichever it is.

Then: startup (from the launch of a fresh process to the end of its first 10k
evaluation, as ``fedforge run`` starts, by phase, median of 3), the default job's wall time
to 99% (``configs/default.yaml``) and its rounds in fp32 and bf16 (with
``--job-seeds config,1,2``, at several seeds: the rounds ratio is then a mean of
the per-seed ratios), and a
scaling table (2NN, 1,000 clients of 60 samples, cohorts 10/100/1000: seconds
per round over rounds 2-5 of 6: the first is a warm-up, the last evaluates;
peak RSS of a fresh process).
Last line: RESULT with the headline ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fedforge import config as config_mod
from fedforge.algorithms import cross_entropy
from fedforge.client.runtime import ClientTask
from fedforge.core import wire
from fedforge.core.allocator import keep_large_blocks
from fedforge.core.precision import forward_context, native_bf16
from fedforge.data.federated import load_federated_data
from fedforge.engines import close_engine
from fedforge.engines.pool import usable_cores
from fedforge.models import build_model
from fedforge.selection.sampling import sample_cohort
from fedforge.server.experiment import Experiment, build

ROOT = Path(__file__).resolve().parent.parent
CL = torch.channels_last


def central(
    model_name: str, x: torch.Tensor, y: torch.Tensor, batch: int, precision: str = "fp32"
) -> float:
    """Seconds for one epoch of plain PyTorch SGD over (x, y) at ``batch``, in the
    fastest fp32 layout (channels_last for the CNN); ``bf16``: forward passes under
    bf16 autocast."""
    model = build_model(model_name, 0)
    if model_name == "cnn":
        model = model.to(memory_format=CL)
        x = x.to(memory_format=CL)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for idx in perm.split(batch):
        opt.zero_grad(set_to_none=True)
        with forward_context(precision):
            logits = model(x[idx])
        cross_entropy(logits.float(), y[idx]).mean().backward()
        opt.step()
    return time.perf_counter() - t0


def _one_thread() -> None:
    torch.set_num_threads(1)


def _central_arrays(
    model_name: str, x: np.ndarray, y: np.ndarray, batch: int, precision: str
) -> float:
    """:func:`central` on arrays: what the processes receive (see CentralProcesses)."""
    return central(model_name, torch.from_numpy(x), torch.from_numpy(y), batch, precision)


class CentralProcesses:
    """Plain PyTorch on one single-threaded process per core, each on its share of
    the samples (no synchronisation: an upper bound for data parallelism)."""

    def __init__(self, procs: int) -> None:
        self.pool = multiprocessing.get_context("fork").Pool(procs, initializer=_one_thread)
        self.procs = procs

    def __call__(
        self,
        name: str,
        x: torch.Tensor,
        y: torch.Tensor,
        batch: int,
        split: bool = True,
        precision: str = "fp32",
    ) -> float:
        """``split``: ``batch`` is the global batch, cut over the processes (data
        parallelism); otherwise every process trains at ``batch`` on its share."""
        each = max(1, batch // self.procs) if split else batch
        # The shares go as numpy arrays: a pickled tensor is moved into shared
        # memory by torch's reductions, and after that this process ran its own
        # 2-thread work (the one-process engines, central_b) about half as fast
        # (measured here, ad hoc; sessions 2-12 measured them so).
        shares = [
            (name, x[part :: self.procs].numpy(), y[part :: self.procs].numpy(), each, precision)
            for part in range(self.procs)
        ]
        # Each process times its own epoch; the slowest one is the wall time
        # (handing the shares over is not part of the training).
        return max(self.pool.starmap(_central_arrays, shares))

    def close(self) -> None:
        self.pool.terminate()


def engine_runner(cfg: config_mod.Config, data: object) -> tuple[Experiment, Callable[[], float]]:
    """A built experiment and a function timing one round's client work on it
    (samples per second); building and worker start-up are not timed."""
    exp = build(cfg, data)  # type: ignore[arg-type]
    cohort = sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, 0)
    payload = wire.encode({"params": exp.initial_params})
    tasks = [ClientTask(c, 0, exp.algorithm.plan(0), cfg.seed) for c in cohort]
    samples = sum(exp.data.num_examples(c) for c in cohort) * cfg.local_epochs

    def once() -> float:
        t0 = time.perf_counter()
        for _ in exp.engine.run_cohort(tasks, payload):
            pass
        return samples / (time.perf_counter() - t0)

    return exp, once


def measure_model(model_name: str, blocks: int, cores: int) -> dict[str, float]:
    cfg = config_mod.Config(
        model=model_name, num_clients=100, client_fraction=0.1, local_epochs=1,
        batch_size=10, target_accuracy=None,
    )  # fmt: skip
    data = load_federated_data(cfg)
    cohort = sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, 0)
    idx = torch.cat([torch.tensor(data.partition.client_indices[c]) for c in cohort])
    x, y = data.train_x[idx], data.train_y[idx]
    k, n = len(cohort), len(y)
    mp = CentralProcesses(cores)
    engines = {
        "serial": {"engine": "serial", "workers": 1},
        "vectorized": {"engine": "vectorized", "workers": 1},
        "serial_w": {"engine": "serial", "workers": cores},
        "vectorized_w": {"engine": "vectorized", "workers": cores},
    }
    bf16_runs: dict[str, Callable[[], float]] = {}
    if model_name == "cnn":
        engines["bf16_w"] = {"engine": "serial", "workers": cores, "precision": "bf16"}
        bf16_runs = {  # the machine's bf16 at batch K*B: what bf16 can give this work
            "central_kb_bf16_1p": lambda: n / central(model_name, x, y, 10 * k, "bf16"),
            "central_kb_bf16_mp": lambda: n / mp(model_name, x, y, 10 * k, precision="bf16"),
        }
    built = {name: engine_runner(config_mod.override(cfg, o), data) for name, o in engines.items()}
    runs: dict[str, Callable[[], float]] = {
        "central_b": lambda: n / central(model_name, x, y, 10),
        "central_b_mp": lambda: n / mp(model_name, x, y, 10),
        "central_b_each": lambda: n / mp(model_name, x, y, 10, split=False),
        "central_kb_1p": lambda: n / central(model_name, x, y, 10 * k),
        "central_kb_mp": lambda: n / mp(model_name, x, y, 10 * k),
        **{name: once for name, (_exp, once) in built.items()},
        **bf16_runs,
    }
    try:
        for fn in runs.values():  # warm-up: allocator, vmap tracing, worker start
            fn()
        rates: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(blocks):
            for name, fn in runs.items():
                rates[name].append(fn())
        eval_s = _eval_seconds(built["serial"][0])
    finally:
        mp.close()
        for exp, _ in built.values():
            close_engine(exp.engine)

    def best(one: str, many: str) -> list[float]:  # per block: the faster way to run it
        return [max(a, b) for a, b in zip(rates[one], rates[many], strict=True)]

    rates["central_kb"] = best("central_kb_1p", "central_kb_mp")
    # engine: auto, workers: 0 (engine_choice.make_engine): the 2NN's fused path in one
    # process, the CNN's serial engine over one worker a core
    auto = "vectorized" if model_name != "cnn" else "serial_w"
    rates["engine"] = rates[auto]
    out = {name: statistics.median(r) for name, r in rates.items()}

    def paired(a: str, b: str) -> float:
        return statistics.median(ra / rb for ra, rb in zip(rates[a], rates[b], strict=True))

    out["engine_vs_central_kb"] = paired("engine", "central_kb")
    out["engine_vs_serial"] = paired("engine", "serial")
    out["vectorized_vs_serial"] = paired("vectorized", "serial")
    out["serial_w_vs_central_b_mp"] = paired("serial_w", "central_b_mp")
    # What per-client training at B costs the kernels: plain PyTorch at B = 10
    # in one single-threaded process per core, against central K*B. An engine
    # that trains each client on its own weights with these kernels gets no
    # higher unless it batches clients into bigger products (batched_mlp.py).
    out["per_client_ceiling"] = paired("central_b_each", "central_kb")
    out["engine_vs_central_b_each"] = paired("engine", "central_b_each")
    if "bf16_w" in rates:
        out["bf16_vs_fp32"] = paired("bf16_w", "serial_w")
        rates["central_kb_bf16"] = best("central_kb_bf16_1p", "central_kb_bf16_mp")
        out["central_kb_bf16"] = statistics.median(rates["central_kb_bf16"])
        out["central_bf16_vs_fp32"] = paired("central_kb_bf16", "central_kb")
    out["eval_s"] = eval_s
    return out


def _eval_seconds(exp: Experiment) -> float:
    from fedforge.evaluation.evaluate import evaluate

    data = exp.data
    t0 = time.perf_counter()
    evaluate(
        exp.model,
        exp.spec,
        exp.initial_params,
        data.test_x,
        data.test_y,
        exp.cfg.evaluation.batch_size,
    )
    return time.perf_counter() - t0


def _python(code: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def startup_seconds(repeats: int = 3) -> dict[str, float]:
    """Fresh processes as ``fedforge run`` starts: import fedforge (which imports
    torch), load MNIST and build the default job, evaluate the 10k test set once.
    ``ready_s`` runs from the launch (interpreter start included) to the
    evaluation's end; ``process_s`` also counts the interpreter's exit (torch's
    teardown, ~0.4 s here), which a run pays at its end, not at its start;
    ``torch_s`` is importing torch alone, in processes of its own. Medians over
    ``repeats`` processes."""
    code = (
        "import time;w=time.time();t=time.perf_counter();import json,fedforge;"
        "from fedforge import config as c;from fedforge.server.experiment import build;"
        "from fedforge.evaluation.evaluate import evaluate;a=time.perf_counter();"
        f"cfg=c.load('{ROOT / 'configs' / 'default.yaml'}');e=build(cfg);b=time.perf_counter();"
        "d=e.data;evaluate(e.model,e.spec,e.initial_params,d.test_x,d.test_y,cfg.evaluation.batch_size);"
        "n=time.perf_counter();print(json.dumps({'ready_at':time.time(),'interpreter_s':w,"
        "'import_s':a-t,'build_s':b-a,'eval_s':n-b}))"
    )
    torch_only = (
        "import json,time;t=time.perf_counter();import torch;"
        "print(json.dumps({'torch_s':time.perf_counter()-t}))"
    )
    runs = []
    for _ in range(repeats):
        launched, t0 = time.time(), time.perf_counter()
        out = _python(code)
        out["process_s"] = time.perf_counter() - t0
        out["ready_s"] = out.pop("ready_at") - launched
        out["interpreter_s"] -= launched
        out |= _python(torch_only)
        runs.append(out)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def default_job(precision: str, seed: int | None = None) -> dict[str, float]:
    """The default job (configs/default.yaml, ``make run``) in a fresh process;
    ``seed`` replaces the config's (None: keep it)."""
    changes = {"precision": precision} | ({} if seed is None else {"seed": seed})
    code = (
        "import json,time;t=time.perf_counter();from fedforge import config as c;"
        "from fedforge.server.loop import run;"
        f"cfg=c.load('{ROOT / 'configs' / 'default.yaml'}');"
        f"cfg=c.override(cfg,{changes!r});"
        "r=run(cfg,store=False);s=r.summary;"
        "print(json.dumps({'wall_s':time.perf_counter()-t,'rounds':s['rounds_to_target'],"
        "'rounds_done':s['rounds_done'],'best':s['best_accuracy']}))"
    )
    return _python(code)


def scaling_point(cohort: int, engine: str, workers: int, rounds: int = 6) -> dict[str, float]:
    """A 2NN federation of 1,000 clients of 60 samples with a cohort of ``cohort``
    clients in a fresh subprocess (its own peak RSS); seconds per round over the
    rounds between the first (warm-up: vmap tracing, worker start) and the last
    (it evaluates). The peak is the subprocess's ``VmHWM`` (Linux): its
    ``ru_maxrss`` starts at this process's RSS at the fork (Linux keeps the
    high-water mark across exec), which is what sessions 2-12 reported."""
    code = (
        "import json,time,resource;from fedforge import config as c;"
        "from fedforge.server.loop import run;"
        f"cfg=c.Config(model='2nn',num_clients=1000,client_fraction={cohort / 1000},batch_size=10,"
        f"rounds={rounds},target_accuracy=None,evaluation=c.EvaluationConfig(every={rounds}),engine='{engine}',"
        f"workers={workers});r=run(cfg,store=False);sec=[x.seconds for x in r.rounds[1:-1]];"
        "import os;hwm=[int(l.split()[1]) for l in open('/proc/self/status') if "
        "l.startswith('VmHWM')] if os.path.exists('/proc/self/status') else [];"
        "kib=hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        "print(json.dumps({'s_per_round':sum(sec)/len(sec),'peak_mib':kib/1024}))"
    )
    return _python(code)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--models", default="2nn,cnn")
    p.add_argument("--scaling", default="10,100,1000")
    p.add_argument("--no-default-job", action="store_true")
    p.add_argument("--no-startup", action="store_true")
    p.add_argument(
        "--job-seeds", default="config",
        help="seeds of the default job, 'config' for the config's own, e.g. config,1,2: "
        "rounds to 99%% vary with the seed, so the bf16/fp32 rounds ratio is the mean "
        "of the per-seed ratios",
    )  # fmt: skip
    p.add_argument("--job-precisions", default="fp32,bf16")
    args = p.parse_args(argv)
    keep_large_blocks()  # the centralized reference gets the runs' allocator settings too
    cores = usable_cores()
    torch.set_num_threads(cores)
    blocks = 1 if args.quick else args.blocks
    native = "native bf16" if native_bf16() else "no native bf16 (no AMX or AVX512-BF16)"
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"cores {cores}; torch {torch.__version__}; {capability}; {native}")
    results = {m: measure_model(m, blocks, cores) for m in args.models.split(",") if m}
    cols = ["central_b", "central_b_mp", "central_b_each", "central_kb", "serial",
            "vectorized", "serial_w", "vectorized_w", "bf16_w", "central_kb_bf16"]  # fmt: skip
    print("samples/s, median of blocks")
    print(f"{'model':<6}" + "".join(f"{c:>16}" for c in cols))
    for m, r in results.items():
        print(f"{m:<6}" + "".join(f"{r.get(c, float('nan')):>16.0f}" for c in cols))
    ratios = ["engine_vs_central_kb", "engine_vs_serial", "vectorized_vs_serial",
              "serial_w_vs_central_b_mp", "per_client_ceiling", "engine_vs_central_b_each",
              "bf16_vs_fp32", "central_bf16_vs_fp32", "eval_s"]  # fmt: skip
    print(f"{'model':<6}" + "".join(f"{c:>26}" for c in ratios))
    for m, r in results.items():
        print(f"{m:<6}" + "".join(f"{r.get(c, float('nan')):>26.2f}" for c in ratios))
    fields = []
    for m, r in results.items():
        fields.append(f"vec_vs_central_kb_{m}={r['engine_vs_central_kb']:.2f}")
        fields.append(f"per_client_ceiling_{m}={r['per_client_ceiling']:.2f}")
        fields.append(f"vec_vs_serial_{m}={r['engine_vs_serial']:.2f}")
    if "cnn" in results:
        fields.append(f"bf16_vs_fp32_cnn={results['cnn']['bf16_vs_fp32']:.2f}")
        fields.append(f"central_bf16_vs_fp32_cnn={results['cnn']['central_bf16_vs_fp32']:.2f}")
    if not (args.quick or args.no_startup):
        up = startup_seconds()
        print(
            f"startup, launch to evaluated (median of 3 fresh processes): {up['ready_s']:.2f} s = "
            f"interpreter {up['interpreter_s']:.2f} + import fedforge {up['import_s']:.2f} "
            f"(torch alone {up['torch_s']:.2f}) + MNIST and build {up['build_s']:.2f} + 10k "
            f"evaluation {up['eval_s']:.2f}; with the interpreter's exit {up['process_s']:.2f} s"
        )
        fields.append(f"startup_s={up['ready_s']:.2f}")
    if not (args.quick or args.no_default_job):
        seeds = [None if x == "config" else int(x) for x in args.job_seeds.split(",") if x]
        precisions = [x for x in args.job_precisions.split(",") if x]
        ratios_by_seed = []
        for seed in seeds:
            jobs = {prec: default_job(prec, seed) for prec in precisions}
            name = "config" if seed is None else seed
            for prec, j in jobs.items():
                print(f"default job {prec}, seed {name}: {j['wall_s']:.0f} s, rounds to 99% "
                      f"{j['rounds']}, best {j['best']:.4f} after {j['rounds_done']} rounds",
                      flush=True)  # fmt: skip
            if seed is None and "fp32" in jobs:
                fields.append(f"default_job_s={jobs['fp32']['wall_s']:.0f}")
            if {"fp32", "bf16"} <= set(jobs):
                r32, r16 = jobs["fp32"]["rounds"], jobs["bf16"]["rounds"]
                ratios_by_seed.append((r16 / r32) if (r16 and r32) else float("nan"))
        if ratios_by_seed:
            by_seed = " ".join(f"{r:.3f}" for r in ratios_by_seed)
            print(f"bf16/fp32 rounds to 99% by seed: {by_seed}")
            fields.append(f"bf16_rounds_ratio={statistics.mean(ratios_by_seed):.2f}")
    scaling = [] if args.quick else [int(c) for c in args.scaling.split(",") if c]
    if scaling:
        print(f"{'cohort':>7}{'engine':>16}{'s/round':>10}{'peak MiB':>10}")
        for c in scaling:
            for engine, workers in (("serial", 1), ("vectorized", 1), ("vectorized", cores)):
                pt = scaling_point(c, engine, workers)
                label = engine if workers == 1 else f"{engine}x{workers}"
                print(f"{c:>7}{label:>16}{pt['s_per_round']:>10.2f}{pt['peak_mib']:>10.0f}")
                if c == max(scaling) and (engine, workers) == ("vectorized", 1):
                    fields.append(f"peak_mib_{c}={pt['peak_mib']:.0f}")
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())

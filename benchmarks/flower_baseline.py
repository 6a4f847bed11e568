"""Flower baseline: FedAvg on MNIST with Flower 1.42's Ray simulation backend,
seconds per round at cohorts of 100 and 1,000 of a 1,000-client population.

Flower is a benchmark-only dependency, never fedforge's (flwr[simulation]
pins ray and protobuf versions that conflict with the project's), so this
script runs in its own virtual environment, created once with:

    python3 -m venv /work/flwr-venv && \\
        /work/flwr-venv/bin/pip install "flwr[simulation]==1.42.0" torch==2.13.0 numpy

(the same pins as ``benchmarks/flower_requirements.txt``; torch must stay 2.13.0,
the CPU build the project uses, so check that pip names torch 2.13.0)

and is then run with that interpreter:

    FEDFORGE_DATA=/work/shared/data /work/flwr-venv/bin/python benchmarks/flower_baseline.py \\
        --model 2nn --cohorts 100,1000 --rounds 3

It imports nothing from fedforge. The workload is the one fedforge's
``benchmarks/ray_engine.py`` runs: the MNIST training set (read from
``$FEDFORGE_DATA/mnist/*.gz``, pixels standardised with mean 0.1307 and std
0.3081, float32), an IID split over 1,000 clients of 60 examples each (a
seeded permutation cut into equal parts), the 2NN (784-200-200-10, ReLU) or
McMahan et al.'s CNN (conv5x5 32, maxpool 2, conv5x5 64, maxpool 2, fc 512,
fc 10), local SGD with E = 1, B = 10, lr = 0.1, one torch thread per client
task, each client task holding 1 CPU (``client_resources``). The cohort is
``fraction_train`` = cohort / 1,000 of Flower's message-based FedAvg, with no
federated evaluation (``fraction_evaluate`` = 0) and no central evaluation.

Each cohort is its own simulation (Ray started, then shut down): round 1 is a
warm-up that is not counted (the actors' start, their first import of torch
and their one-time load of MNIST fall in it, as does Ray's start-up before
it), then ``--rounds`` rounds are timed from the strategy's ``configure_train``
to the end of its ``aggregate_train``. Per round the script also prints the
summed fit time the clients measured around their own training loop, and
Flower's overhead: the round time minus that sum divided by the number of
client tasks that can run at once (CPUs / CPUs per client), and the CPU
seconds the driver process (the ServerApp, Flower's in-memory link state and
its message threads, Ray's driver) spent in the round, all its threads
together: on a machine of few cores, CPU the clients' tasks do not get.

Last line: ``RESULT flower_<model>_s_per_round_<cohort>=...`` for every cohort
run.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import random
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

NUM_CLIENTS = 1000
PER_CLIENT = 60
BATCH = 10
LR = 0.1
EPOCHS = 1
SEED = 0
MEAN, STD = 0.1307, 0.3081
SETUP = (
    "python3 -m venv /work/flwr-venv && /work/flwr-venv/bin/pip install "
    "'flwr[simulation]==1.42.0' torch==2.13.0 numpy"
)
HAVE_FLOWER = all(importlib.util.find_spec(m) is not None for m in ("flwr", "ray", "torch"))

if HAVE_FLOWER:
    import numpy as np
    import torch
    from flwr.app import (
        ArrayRecord,
        ConfigRecord,
        Context,
        Message,
        MetricRecord,
        RecordDict,
    )
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation
    from torch import nn


def read_idx(path: Path) -> np.ndarray:
    """An idx file (gzip) as a numpy array of its declared shape (uint8 data)."""
    raw = gzip.decompress(path.read_bytes())
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte idx file (header {raw[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def data_dir() -> Path:
    root = Path(os.environ.get("FEDFORGE_DATA", "data"))
    return root / "mnist" if (root / "mnist").is_dir() else root


def load_train() -> tuple[torch.Tensor, torch.Tensor]:
    """The standardised MNIST training images [60000, 1, 28, 28] and labels."""
    d = data_dir()
    images = read_idx(d / "train-images-idx3-ubyte.gz")
    labels = read_idx(d / "train-labels-idx1-ubyte.gz")
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0).sub_(MEAN).div_(STD)
    return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def iid_parts(num_samples: int) -> np.ndarray:
    """Client i's example indices: row i of a seeded permutation cut in equal parts."""
    perm = np.random.default_rng(SEED).permutation(num_samples)
    return perm[: NUM_CLIENTS * PER_CLIENT].reshape(NUM_CLIENTS, PER_CLIENT)


def build_model(name: str) -> nn.Module:
    if name == "2nn":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 200),
            nn.ReLU(),
            nn.Linear(200, 200),
            nn.ReLU(),
            nn.Linear(200, 10),
        )
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 512),
        nn.ReLU(),
        nn.Linear(512, 10),
    )


# Per actor process: the clients' shards (loaded once, on the first task an actor
# runs, as a worker-local copy) and one model per architecture to load weights into.
_SHARDS: dict[str, Any] = {}
_MODELS: dict[str, nn.Module] = {}


def client_shard(cid: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not _SHARDS:
        x, y = load_train()
        parts = torch.from_numpy(iid_parts(len(y)))
        _SHARDS["x"], _SHARDS["y"] = x[parts].contiguous(), y[parts].contiguous()
    return _SHARDS["x"][cid], _SHARDS["y"][cid]


if HAVE_FLOWER:
    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        """E local epochs of SGD at batch B on this client's shard."""
        torch.set_num_threads(1)
        config = msg.content["config"]
        name = str(config["model"])
        cid = int(context.node_config["partition-id"])
        x, y = client_shard(cid)
        model = _MODELS.setdefault(name, build_model(name))
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        gen = torch.Generator().manual_seed(
            SEED * 1_000_003 + int(config["server-round"]) * 7919 + cid
        )
        start = time.perf_counter()
        for _ in range(EPOCHS):
            order = torch.randperm(len(y), generator=gen)
            for i in range(0, len(y), BATCH):
                idx = order[i : i + BATCH]
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
        fit_s = time.perf_counter() - start
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord({"num-examples": len(y), "fit-seconds": fit_s}),
            }
        )
        return Message(content=content, reply_to=msg)

    class TimedFedAvg(FedAvg):
        """FedAvg that records each round's wall time and its clients' fit times."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.rounds: list[dict[str, float]] = []
            self._start = 0.0
            self._cpu = 0.0

        def configure_train(self, server_round, arrays, config, grid):  # type: ignore[no-untyped-def]
            self._start = time.perf_counter()
            self._cpu = time.process_time()
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
            replies = list(replies)
            fit = sum(
                float(m.content["metrics"]["fit-seconds"]) for m in replies if m.has_content()
            )
            out = super().aggregate_train(server_round, replies)
            self.rounds.append(
                {
                    "round_s": time.perf_counter() - self._start,
                    "driver_cpu_s": time.process_time() - self._cpu,
                    "fit_sum_s": fit,
                    "replies": float(sum(m.has_content() for m in replies)),
                }
            )
            return out


def run_cohort(
    model_name: str, cohort: int, rounds: int, client_cpus: int
) -> tuple[list[dict[str, float]], float]:
    """One simulation: a warm-up round plus ``rounds`` timed ones; every round's
    figures (the warm-up first) and the seconds of the whole simulation, Ray's
    start and shutdown included."""
    # The ClientApp by module reference: Ray's actors import this module once and
    # keep its shard cache, instead of unpickling a copy of __main__ per task.
    import flower_baseline as mod

    random.seed(SEED)  # Flower samples the cohort with the random module
    torch.manual_seed(SEED)
    strategy = mod.TimedFedAvg(
        fraction_train=cohort / NUM_CLIENTS,
        fraction_evaluate=0.0,
        min_train_nodes=cohort,
        min_evaluate_nodes=0,
        min_available_nodes=NUM_CLIENTS,
    )
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        initial = ArrayRecord(build_model(model_name).state_dict())
        strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=rounds + 1,
            train_config=ConfigRecord({"model": model_name}),
        )

    start = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=mod.client_app,
        num_supernodes=NUM_CLIENTS,
        backend_config={
            "client_resources": {"num_cpus": client_cpus, "num_gpus": 0.0},
            "init_args": {
                "num_cpus": os.cpu_count() or 1,
                "object_store_memory": 1 << 30,
            },
        },
    )
    if len(strategy.rounds) != rounds + 1:
        raise RuntimeError(
            f"cohort {cohort}: {len(strategy.rounds)} rounds finished of {rounds + 1}"
        )
    return strategy.rounds, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("2nn", "cnn"), default="2nn")
    parser.add_argument("--cohorts", default="100,1000", help="comma-separated cohort sizes")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after 1 warm-up")
    parser.add_argument("--client-cpus", type=int, default=1, help="CPUs per client task")
    args = parser.parse_args()
    if not HAVE_FLOWER:
        print(f"flower_baseline: flwr[simulation] is not installed here; create its venv: {SETUP}")
        sys.exit(2)
    cohorts = [int(c) for c in args.cohorts.split(",")]
    if any(not 0 < c <= NUM_CLIENTS for c in cohorts) or args.rounds < 1:
        parser.error(f"cohorts must be in 1..{NUM_CLIENTS} and --rounds >= 1")
    slots = max(1, (os.cpu_count() or 1) // args.client_cpus)
    result = {}
    for cohort in cohorts:
        every, wall = run_cohort(args.model, cohort, args.rounds, args.client_cpus)
        timed = every[1:]
        parallel = min(slots, cohort)
        print(f"\nflower {args.model} cohort {cohort}: {parallel} client tasks at once")
        print(
            f"whole simulation {wall:.1f} s; warm-up round 1 {every[0]['round_s']:.2f} s"
            " (actors' start, MNIST load per actor); not counted"
        )
        print("round  seconds  clients  fit_sum_s  fit_per_client_s  overhead_s  driver_cpu_s")
        for i, r in enumerate(timed, start=2):
            overhead = r["round_s"] - r["fit_sum_s"] / parallel
            print(
                f"{i:5d}  {r['round_s']:7.2f}  {int(r['replies']):7d}  {r['fit_sum_s']:9.2f}"
                f"  {r['fit_sum_s'] / r['replies']:16.4f}  {overhead:10.2f}"
                f"  {r['driver_cpu_s']:12.2f}"
            )
        mean = statistics.fmean(r["round_s"] for r in timed)
        over = statistics.fmean(r["round_s"] - r["fit_sum_s"] / parallel for r in timed)
        print(f"mean {mean:.2f} s/round, Flower overhead {over:.2f} s/round ({over / mean:.0%})")
        result[f"flower_{args.model}_s_per_round_{cohort}"] = mean
        result[f"flower_{args.model}_overhead_s_{cohort}"] = over
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in result.items()))


if __name__ == "__main__":
    main()

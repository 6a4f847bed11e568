"""Which engine a run's clients train on: the config's, or the nearest one that can
run it, with the reason in one line; ``engine: auto`` by the measured rules and,
given the data's shapes, the probe (probe.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

from fedforge.client.runtime import ClientRuntime
from fedforge.config import Config
from fedforge.core.device import HOST
from fedforge.core.errors import ConfigError
from fedforge.engines import Engine, batched_mlp
from fedforge.engines.pool import DEVICE_IN_ONE_PROCESS, PoolEngine, resolve_workers
from fedforge.engines.ray_engine import RayEngine, RaySettings
from fedforge.engines.serial import SerialEngine
from fedforge.engines.threads import ThreadPlan, thread_plan, usable_cores
from fedforge.engines.vectorized import (
    DEFAULT_MEMORY_BUDGET,
    VectorizedEngine,
    schedule_bytes,
    unsupported_reason,
)
from fedforge.server import probe
from fedforge.store.client_state import ClientStateStore
from fedforge.store.relocated import relocatable


def auto_vectorize(runtime: ClientRuntime) -> bool:
    """``engine: auto``: the vectorised engine where it can run and is the faster.
    Measured here (docs/changelog.md, benchmarks/engine_throughput.py): 1.6x the
    serial engine on the 2NN, but slower on the CNN, whose vmapped convolutions
    become grouped convolutions (slow on CPU) while the serial engine runs them
    channels_last; so models with convolutions stay serial."""
    model = runtime.model
    if any(isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d) for m in model.modules()):
        return False
    alg = runtime.algorithm
    return unsupported_reason(model) is None and alg.personal is None and alg.local_train is None


def _fused_in_one_process(inner: str, runtime: ClientRuntime) -> bool:
    """``workers: 0`` keeps the vectorised engine's fused perceptron path in this
    process, its cores as torch threads: measured faster than one process a core
    (2NN, 600-sample clients: 94k against 83k samples/s; 60-sample clients, a
    cohort of 100: 52k against 30k), no update crossing a pipe. The vmap path
    (momentum, other models) still takes the workers (20k against 23k). The
    probe of ``engine: auto`` measures this on the machine instead (probe.py)."""
    if inner != "vectorized":
        return False
    alg = runtime.algorithm
    return batched_mlp.applies(runtime.model, alg, alg.plan(0), None)


@dataclass
class EngineChoice:
    """The engine a run takes, what it says of the config, the probe's line."""

    engine: Engine
    notes: list[str]
    threads: ThreadPlan
    probe_line: str | None = None


def make_engine(
    name: str,
    runtime: ClientRuntime,
    workers: int = 1,
    side_state: str | None = None,
    largest_client: int = 0,
) -> tuple[Engine, str | None]:
    """The engine a config asks for (spread over ``workers`` processes when there
    are several), or the nearest one that can run, with the reason in one line.
    ``side_state``: what of the run lives in this process besides the runtime's
    tables (secure aggregation's keys, adaptive clipping's board), if anything.
    ``largest_client``: the most examples a client holds. No probe."""
    choice = choose_engine(name, runtime, workers, side_state, largest_client)
    return choice.engine, "; ".join(choice.notes) or None


def choose_engine(
    name: str,
    runtime: ClientRuntime,
    workers: int = 1,
    side_state: str | None = None,
    largest_client: int = 0,
    threads: int | None = None,
    probe_input: probe.ProbeInput | None = None,
) -> EngineChoice:
    """:func:`make_engine` with the torch threads of its processes (``threads``:
    the config's) and, for ``engine: auto`` given ``probe_input``, the probe's
    pick among the configurations the static rules allow."""
    notes: list[str] = []
    vector_reason = _vector_reason(runtime, largest_client)
    wanted = name == "vectorized" or (name == "auto" and auto_vectorize(runtime))
    inner = "vectorized" if wanted and vector_reason is None else "serial"
    if name == "vectorized" and vector_reason is not None:
        notes.append(f"engine: vectorized cannot run this ({vector_reason}); serial")
    count, cores = resolve_workers(workers), usable_cores()
    if count > cores:  # more processes than cores would only share the cores
        notes.append(f"workers: {count} lowered to {cores}, the cores this process may use")
        count = cores
    alg = runtime.algorithm
    client_tables = alg.client is not None and bool(alg.client.tables)
    keeps = client_tables or alg.personal is not None or side_state is not None
    layout = 0 if count < 2 or (workers == 0 and _fused_in_one_process(inner, runtime)) else count
    if layout and keeps:
        why = side_state or f"algorithm '{alg.name}' keeps per-client state between rounds"
        notes.append(f"workers: {count} cannot be used ({why}); one process")
        layout = 0
    device = runtime.device
    if layout and device != HOST:
        notes.append(f"workers: {count} cannot be used on {device} ({DEVICE_IN_ONE_PROCESS})")
        layout = 0
    line = None
    samples = probe.probe_samples()
    # the probe times CPU configurations: a run on another device takes the rules' pick
    host = device == HOST
    if name == "auto" and probe_input is not None and samples and alg.client is None and host:
        # convolutions stay serial (auto_vectorize): vmapped, they run as grouped
        # convolutions, slower on CPU and too slow to be worth a probe's seconds
        vector = vector_reason is None and auto_vectorize(runtime)
        inners = ["serial"] + (["vectorized"] if vector else [])
        layouts = [count] if workers != 0 and count >= 2 else [0, count] if count >= 2 else [0]
        layouts = [n for n in layouts if n == 0 or not keeps]
        candidates = [
            probe.Candidate(i, n, thread_plan(threads, cores, n).worker if n else cores)
            for i in inners
            for n in layouts
        ]
        incumbent = next((c for c in candidates if (c.inner, c.workers) == (inner, layout)), None)
        if len(candidates) > 1 and incumbent is not None:
            picked = probe.choose(
                candidates, incumbent, runtime, probe_input, _candidate_engine, samples
            )
            inner, layout, line = picked.candidate.inner, picked.candidate.workers, picked.line()
    plan = thread_plan(threads, cores, layout)
    engine = _candidate_engine(probe.Candidate(inner, layout, plan.worker), runtime)
    return EngineChoice(engine, notes, plan, line)


def driver_device(cfg: Config) -> str:
    """The device the run's own process holds the model on: the config's, except
    under ``engine: ray`` with GPUs reserved for the workers: they train on
    ``device`` (each resolves it where it runs) and the driver (aggregation,
    evaluation) uses a GPU only when it sees one. GPUs reserved for workers told
    to train on the CPU are refused here, before the data loads."""
    if cfg.engine == "ray" and cfg.ray.num_gpus > 0:
        if cfg.device == "cpu":
            raise ConfigError(
                f"ray.num_gpus {cfg.ray.num_gpus:g} reserves GPUs for the workers but device "
                "is 'cpu': set device: cuda (or auto) to train the clients on them, or "
                "ray.num_gpus: 0"
            )
        return "auto"
    return cfg.device


def ray_choice(
    runtime: ClientRuntime,
    tables: Mapping[str, ClientStateStore],
    settings: RaySettings,
    driver_state: str | None,
    threads: int | None,
    precision: str,
) -> EngineChoice:
    """``engine: ray``: the Ray engine, its workers holding the per-client
    ``tables``; refused in one line where part of the clients' state can only
    live in the driver (``driver_state``) or a table cannot move. Its note: where
    the workers emulate the run's ``precision`` (bf16 on CPUs without it)."""
    if driver_state is not None:
        raise ConfigError(f"engine: ray cannot run this: {driver_state}; use engine: serial")
    for name, table in tables.items():
        if not relocatable(table):
            raise ConfigError(
                f"engine: ray cannot run this: the per-client table '{name}' is a "
                f"{type(table).__name__}, which cannot move to the Ray workers (a table "
                "made by fedforge.store.make_state_store can); use engine: serial"
            )
    plan = thread_plan(threads, usable_cores(), 0)  # the driver's: aggregation, evaluation
    engine = RayEngine(runtime, tables, settings)
    try:
        note = engine.precision_note(precision) if precision == "bf16" else None
    except BaseException:
        engine.close()
        raise
    return EngineChoice(engine, [note] if note else [], plan)


def _candidate_engine(candidate: probe.Candidate, runtime: ClientRuntime) -> Engine:
    """The engine of one configuration: its inner engine, in a pool if it has workers."""
    inner: SerialEngine | VectorizedEngine = (
        VectorizedEngine(runtime) if candidate.inner == "vectorized" else SerialEngine(runtime)
    )
    if candidate.workers == 0:
        return inner
    return PoolEngine(inner, candidate.workers, candidate.threads)


def _vector_reason(runtime: ClientRuntime, largest_client: int) -> str | None:
    """Why the vectorised engine cannot run this, or None."""
    plan = runtime.algorithm.plan(0)
    reason = unsupported_reason(runtime.model)
    schedule = schedule_bytes(largest_client, plan.batch_size, plan.local_epochs)
    if reason is None and schedule > DEFAULT_MEMORY_BUDGET:  # e.g. local_epochs: 1e9
        reason = (
            f"a client's {plan.local_epochs} local epochs of minibatch indices would "
            f"take {schedule / 2**30:.3g} GiB, more than its memory budget of "
            f"{DEFAULT_MEMORY_BUDGET / 2**30:.3g} GiB; the serial engine draws them an "
            "epoch at a time"
        )
    if reason is None and runtime.algorithm.personal is not None:
        reason = f"algorithm '{runtime.algorithm.name}' keeps entries per client"
    if reason is None and runtime.algorithm.local_train is not None:  # Per-FedAvg
        reason = f"algorithm '{runtime.algorithm.name}' runs its own local loop"
    return reason

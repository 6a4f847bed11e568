"""Everything a run is made of, built from a config: data, partition, model,
algorithm, pipeline and engine. The round loop only drives it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedforge import algorithms
from fedforge.aggregation.mean import Aggregator
from fedforge.aggregation.weights import Reweighted
from fedforge.algorithms.base import Algorithm
from fedforge.client import reports
from fedforge.client.runtime import ClientDataFn, ClientRuntime
from fedforge.compression import parts as communication
from fedforge.compression.parts import CommunicationParts
from fedforge.config import Config
from fedforge.config.notes import config_notes
from fedforge.core.allocator import keep_large_blocks
from fedforge.core.device import HOST, resolve_device
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.core.precision import precision_note
from fedforge.data.federated import DTYPES, FederatedData, shift_data
from fedforge.data.given import check_fits, check_given
from fedforge.engines import Engine, batched_mlp
from fedforge.engines.pool import DEVICE_IN_ONE_PROCESS, PoolEngine, resolve_workers
from fedforge.engines.serial import SerialEngine
from fedforge.engines.threads import ThreadPlan, thread_plan, usable_cores
from fedforge.engines.vectorized import (
    DEFAULT_MEMORY_BUDGET,
    VectorizedEngine,
    schedule_bytes,
    unsupported_reason,
)
from fedforge.evaluation.clients import split_holdout
from fedforge.models import BUILT_IN
from fedforge.pipeline.pipeline import Pipeline
from fedforge.privacy import parts as privacy
from fedforge.privacy.parts import PrivacyParts
from fedforge.robust.parts import RobustParts, assemble
from fedforge.server import probe
from fedforge.store.build_record import data_fingerprint
from fedforge.store.checkpoint import RESIDUAL
from fedforge.store.client_state import ClientStateStore
from fedforge.tasks import Task, load_task_data, resolve_task
from fedforge.tasks.metrics import ClassMetrics, Metrics
from fedforge.tasks.task import check_run_fits


def _tracks_statistics(model: nn.Module) -> bool:
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        for m in model.modules()
    )


def fingerprint_of(data: FederatedData) -> str:
    """The fingerprint a run records of the data it was given or loaded."""
    return data_fingerprint(data.train_x, data.train_y, data.test_x, data.test_y, data.partition)


@dataclass
class Experiment:
    """The parts of one run."""

    cfg: Config
    data: FederatedData
    model: nn.Module
    spec: ParamSpec
    algorithm: Algorithm
    pipeline: Pipeline
    engine: Engine
    initial_params: torch.Tensor
    note: str | None = None  # a one-line remark for the user (e.g. an engine fallback)
    robust: RobustParts | None = None  # aggregator, attackers and gates of cfg.robust
    comm: CommunicationParts | None = None  # codecs, residuals, groups of cfg.communication
    privacy: PrivacyParts | None = None  # DP stages, accountant, secure aggregation
    data_fingerprint: str = ""  # of the data as given or loaded (store/build_record.py)
    # what each client trains on: its data less the gate's and the quality weights'
    # held-out slices, an attacker's labels flipped (None: data.client_data)
    train_data: ClientDataFn | None = None
    threads: ThreadPlan | None = None  # torch threads of the run's processes
    probe_line: str | None = None  # engine: auto's probe, its pick and figures
    task: Task | None = None  # what is trained and how it is judged
    metrics: Metrics = dataclasses.field(default_factory=ClassMetrics)  # the task's
    # where local training and evaluation run: the model's device (core/device.py)
    device: torch.device = HOST

    def client_train_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples client ``client_id`` trains on."""
        fn = self.train_data or self.data.client_data
        return fn(client_id)


def build(cfg: Config, data: FederatedData | None = None, task: Task | None = None) -> Experiment:
    """Assemble a run from its config (``data`` may be given to reuse a load, or as
    the caller's own; ``task``: the caller's, else the config's)."""
    keep_large_blocks()  # glibc: reuse freed activation buffers (fedforge.core.allocator)
    dtype = DTYPES[cfg.dtype]
    device = resolve_device(cfg.device)  # before the data loads: a missing GPU fails fast
    task = resolve_task(cfg, task)
    data, model, fingerprint = _run_data(cfg, data, task, dtype)
    if cfg.algorithm == "perfedavg" and _tracks_statistics(model):  # e.g. a registered one
        raise ConfigError(
            f"algorithm 'perfedavg' needs a model without batch norm's running statistics; "
            f"model {cfg.model!r} has some (the three forward passes of a step would move "
            "them three times)"
        )
    spec = ParamSpec.of(model, include_buffers=True)  # batch-norm statistics travel too
    if not any(e.trainable for e in spec.entries):
        raise ConfigError(f"model '{cfg.model}' has no parameter to train (all frozen)")
    initial = spec.flatten(model, dtype)  # the global vector: on the host
    model.to(device)  # every part that runs the model runs it there (a no-op on the host)
    algorithm = algorithms.from_config(cfg, spec.size, dtype, spec)
    if algorithm.loss_fn is not task.loss():  # the task's loss trains every algorithm
        algorithm = dataclasses.replace(algorithm, loss_fn=task.loss())
    metrics = task.scores()
    parts = _assemble(cfg, data, spec, dtype, algorithm, metrics)
    runtime = ClientRuntime(
        model,
        spec,
        algorithm,
        parts.reporter.train_data if parts.reporter is not None else parts.robust.data_fn,
        parts.pipeline.client,
        parts.pipeline.codec,
        gate=parts.robust.gate,
        tamper_fn=parts.robust.tamper_fn,
        downlink=parts.comm.downlink,
        reporter=parts.reporter,
        report_loss=not cfg.privacy.hides_updates,
    )
    choice = _engine_for(cfg, data, runtime, _side_state(parts.comm, parts.priv))
    ignored = "; ".join(config_notes(cfg))
    bf16 = precision_note(cfg.precision) if device == HOST else None  # a CPU's bf16
    notes = (*choice.notes, bf16, ignored)
    return Experiment(
        cfg,
        data,
        model,
        spec,
        algorithm,
        parts.pipeline,
        choice.engine,
        initial,
        "; ".join(n for n in notes if n) or None,
        parts.robust,
        parts.comm,
        parts.priv,
        fingerprint,
        runtime.data_fn,
        choice.threads,
        choice.probe_line,
        task,
        metrics,
        device,
    )


def _run_data(
    cfg: Config, data: FederatedData | None, task: Task, dtype: torch.dtype
) -> tuple[FederatedData, nn.Module, str]:
    """The run's data (the caller's, checked, or loaded), shifted and with each
    client's held-out slice carved when clients are evaluated; the model sized by
    it; and the fingerprint of the data as given or loaded."""
    given = data is not None
    if data is None:  # looked up here: one place to stand in
        data = load_task_data(cfg, task)
    task.check_labels(data)
    check_run_fits(cfg, task, data)
    model = task.build_model(cfg, data.spec(), dtype)
    name = task.name if task.model is not None else cfg.model
    if given or task.data_fn is not None:  # the caller's: checked before anything reads it
        check_given(data, cfg.num_clients, dtype, model, name)
    elif cfg.model not in BUILT_IN or task.model is not None:  # a model of the caller's
        check_fits(data, model, name)
    fingerprint = fingerprint_of(data)
    data = shift_data(cfg, data)
    if cfg.eval_clients and data.holdout is None:  # carve each client's held-out slice
        keep, held = split_holdout(data.partition, cfg.eval_holdout, cfg.seed)
        data = dataclasses.replace(data, partition=keep, holdout=held)
    return data, model, fingerprint


@dataclass
class _Parts:
    """The run's parts around its clients' training."""

    pipeline: Pipeline
    comm: CommunicationParts
    robust: RobustParts
    priv: PrivacyParts
    reporter: reports.Reporter | None


def _assemble(
    cfg: Config,
    data: FederatedData,
    spec: ParamSpec,
    dtype: torch.dtype,
    algorithm: Algorithm,
    metrics: Metrics,
) -> _Parts:
    """Communication, robustness, reports and privacy, and the pipeline of their stages."""
    comm = communication.assemble(
        cfg.communication, cfg.num_clients, spec, dtype, data.partition, data.train_y
    )
    classes = data.classes() or 0
    robust = assemble(cfg, data.client_data, comm.uplink, classes)
    reporter, weigh = reports.assemble(cfg, robust.data_fn, classes, metrics)  # quality, class
    sizes = [data.num_examples(c) for c in range(cfg.num_clients)]
    priv = privacy.assemble(cfg, sizes)
    privacy.check_algorithm(cfg.privacy, algorithm)
    pipeline = Pipeline(
        aggregator=_weighted(cfg, priv, robust.aggregator),
        client=(*comm.client_stages, *priv.client_stages, *robust.client_stages),
        codec=priv.secagg or comm.uplink,  # secure aggregation: the masked update
        cohort=(*robust.cohort_stages, *weigh),
        server_aggregate=priv.aggregate_stages,
    )
    communication.check_pipeline(cfg.communication, pipeline)
    return _Parts(pipeline, comm, robust, priv, reporter)


def _engine_for(
    cfg: Config, data: FederatedData, runtime: ClientRuntime, side_state: str | None
) -> EngineChoice:
    """The run's engine and threads; ``engine: auto`` probes with the data's shapes."""
    sizes = data.partition.sizes()
    first = next((c for c in range(cfg.num_clients) if data.num_examples(c)), 0)
    info = probe.ProbeInput(
        cfg.model, data.client_data(first), int(np.median(sizes)) if len(sizes) else 1
    )
    largest = int(sizes.max(initial=0))
    return choose_engine(cfg.engine, runtime, cfg.workers, side_state, largest, cfg.threads, info)


def _weighted(cfg: Config, priv: PrivacyParts, robust: Aggregator) -> Aggregator:
    """The round's aggregator, its weights mapped by ``aggregation_weights`` (which
    rules fit which aggregators: config/compat.py weights_need_plain_mean)."""
    rule = cfg.aggregation_weights
    if rule == "num_examples":  # DP and secure aggregation weigh themselves
        return priv.aggregator or priv.secagg_mean or robust
    if rule == "quality" or rule == "class":  # from the cohort's reports: client/reports.py
        return robust
    return Reweighted(robust, rule, cfg.weight_cap)


def client_tables(exp: Experiment) -> dict[str, ClientStateStore]:
    """The run's per-client tables by name (error-feedback ``residual``, SCAFFOLD's
    ``control``): the loop state keeps them and checkpoints save them."""
    tables: dict[str, ClientStateStore] = {}
    if exp.comm is not None and exp.comm.client_state is not None:
        tables[RESIDUAL] = exp.comm.client_state
    if exp.algorithm.client is not None:
        tables.update(exp.algorithm.client.tables)
    if exp.algorithm.personal is not None:  # FedBN's batch norm
        tables.update(exp.algorithm.personal.tables)
    return tables


def _side_state(comm: CommunicationParts, priv: PrivacyParts) -> str | None:
    """What of a run lives in the server process between rounds besides the
    algorithm's tables: worker processes would lose it."""
    if comm.client_state is not None:
        return "error feedback keeps a residual per client"
    if priv.secagg is not None:
        return "secure aggregation keeps its clients' keys in this process"
    if priv.board is not None:
        return "adaptive clipping collects its clients' reports in this process"
    return None


def auto_vectorize(runtime: ClientRuntime) -> bool:
    """``engine: auto``: the vectorised engine where it can run and is the faster.
    Measured here (docs/results.md, benchmarks/engine_throughput.py): 1.6x the
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
    keeps = alg.client is not None or alg.personal is not None or side_state is not None
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

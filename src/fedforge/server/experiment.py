"""Everything a run is made of, built from a config: data, partition, model,
algorithm, pipeline and engine. The round loop only drives it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

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
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.core.precision import precision_note
from fedforge.data.federated import DTYPES, FederatedData, load_federated_data, shift_data
from fedforge.data.given import check_fits, check_given
from fedforge.data.mnist import NUM_CLASSES
from fedforge.engines import Engine, batched_mlp
from fedforge.engines.pool import PoolEngine, resolve_workers, usable_cores
from fedforge.engines.serial import SerialEngine
from fedforge.engines.vectorized import (
    DEFAULT_MEMORY_BUDGET,
    VectorizedEngine,
    schedule_bytes,
    unsupported_reason,
)
from fedforge.evaluation.clients import split_holdout
from fedforge.models import BUILT_IN, build_model
from fedforge.pipeline.pipeline import Pipeline
from fedforge.privacy import parts as privacy
from fedforge.privacy.parts import PrivacyParts
from fedforge.robust.parts import RobustParts, assemble
from fedforge.store.build_record import data_fingerprint
from fedforge.store.checkpoint import RESIDUAL
from fedforge.store.client_state import ClientStateStore


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

    def client_train_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples client ``client_id`` trains on."""
        fn = self.train_data or self.data.client_data
        return fn(client_id)


def build(cfg: Config, data: FederatedData | None = None) -> Experiment:
    """Assemble a run from its config (``data`` may be given to reuse a load)."""
    keep_large_blocks()  # glibc: reuse freed activation buffers (fedforge.core.allocator)
    dtype = DTYPES[cfg.dtype]
    model = build_model(cfg.model, cfg.seed, dtype, cfg.dataset)
    if cfg.algorithm == "perfedavg" and _tracks_statistics(model):  # e.g. a registered one
        raise ConfigError(
            f"algorithm 'perfedavg' needs a model without batch norm's running statistics; "
            f"model {cfg.model!r} has some (the three forward passes of a step would move "
            "them three times)"
        )
    if data is not None:  # the caller's: checked before anything reads it
        check_given(data, cfg.num_clients, dtype, model, cfg.model, NUM_CLASSES)
    else:
        data = load_federated_data(cfg)
        if cfg.model not in BUILT_IN:  # a registered model on a configured data set
            check_fits(data, model, cfg.model, NUM_CLASSES)
    fingerprint = fingerprint_of(data)
    data = shift_data(cfg, data)
    if cfg.eval_clients and data.holdout is None:  # carve each client's held-out slice
        keep, held = split_holdout(data.partition, cfg.eval_holdout, cfg.seed)
        data = dataclasses.replace(data, partition=keep, holdout=held)
    spec = ParamSpec.of(model, include_buffers=True)  # batch-norm statistics travel too
    if not any(e.trainable for e in spec.entries):
        raise ConfigError(f"model '{cfg.model}' has no parameter to train (all frozen)")
    algorithm = algorithms.from_config(cfg, spec.size, dtype, spec)
    comm = communication.assemble(
        cfg.communication, cfg.num_clients, spec, dtype, data.partition, data.train_y
    )
    robust = assemble(cfg, data.client_data, comm.uplink)
    reporter, weigh = reports.assemble(cfg, robust.data_fn, NUM_CLASSES)  # quality, class
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
    runtime = ClientRuntime(
        model,
        spec,
        algorithm,
        reporter.train_data if reporter is not None else robust.data_fn,
        pipeline.client,
        pipeline.codec,
        gate=robust.gate,
        tamper_fn=robust.tamper_fn,
        downlink=comm.downlink,
        reporter=reporter,
        report_loss=not cfg.privacy.hides_updates,
    )
    largest = int(data.partition.sizes().max(initial=0))
    engine, note = make_engine(cfg.engine, runtime, cfg.workers, _side_state(comm, priv), largest)
    ignored = "; ".join(config_notes(cfg))
    note = "; ".join(n for n in (note, precision_note(cfg.precision), ignored) if n) or None
    params = spec.flatten(model, dtype)
    return Experiment(
        cfg,
        data,
        model,
        spec,
        algorithm,
        pipeline,
        engine,
        params,
        note,
        robust,
        comm,
        priv,
        fingerprint,
        runtime.data_fn,
    )


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


def _fused_in_one_process(engine: Engine, runtime: ClientRuntime) -> bool:
    """``workers: 0`` keeps the vectorised engine's fused perceptron path in this
    process, its cores as torch threads: measured faster than one process a core
    (2NN, 600-sample clients: 94k against 83k samples/s; 60-sample clients, a
    cohort of 100: 52k against 30k), no update crossing a pipe. The vmap path
    (momentum, other models) still takes the workers (20k against 23k)."""
    if not isinstance(engine, VectorizedEngine):
        return False
    return batched_mlp.applies(engine.model, runtime.algorithm, runtime.algorithm.plan(0), None)


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
    ``largest_client``: the most examples a client holds."""
    engine: SerialEngine | VectorizedEngine = SerialEngine(runtime)
    notes: list[str] = []
    plan = runtime.algorithm.plan(0)
    schedule = schedule_bytes(largest_client, plan.batch_size, plan.local_epochs)
    if name == "auto":
        if auto_vectorize(runtime) and schedule <= DEFAULT_MEMORY_BUDGET:
            engine = VectorizedEngine(runtime)
    elif name == "vectorized":
        reason = unsupported_reason(runtime.model)
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
        if reason is None:
            engine = VectorizedEngine(runtime)
        else:
            notes.append(f"engine: vectorized cannot run this ({reason}); serial")
    count, cores = resolve_workers(workers), usable_cores()
    if count > cores:  # one torch thread each: more processes would only share the cores
        notes.append(f"workers: {count} lowered to {cores}, the cores this process may use")
        count = cores
    if count < 2 or (workers == 0 and _fused_in_one_process(engine, runtime)):
        return engine, "; ".join(notes) or None
    alg = runtime.algorithm
    keeps = alg.client is not None or alg.personal is not None or side_state is not None
    why = side_state or f"algorithm '{alg.name}' keeps per-client state between rounds"
    if keeps:
        notes.append(f"workers: {count} cannot be used ({why}); one process")
        return engine, "; ".join(notes)
    return PoolEngine(engine, count), "; ".join(notes) or None

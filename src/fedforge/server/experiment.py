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
from fedforge.communication import parts as communication_parts
from fedforge.communication.parts import CommunicationParts
from fedforge.config import Config
from fedforge.config.components import check_names, make
from fedforge.config.notes import config_notes, own_split_note
from fedforge.core import registry
from fedforge.core.allocator import keep_large_blocks
from fedforge.core.device import HOST, resolve_device
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.core.precision import precision_note
from fedforge.data.drift import DriftSchedule
from fedforge.data.federated import DTYPES, FederatedData, shift_data
from fedforge.data.given import check_fits, check_given
from fedforge.data.tags import load_client_tags
from fedforge.engines import Engine
from fedforge.engines.ray_engine import RaySettings
from fedforge.engines.threads import ThreadPlan
from fedforge.evaluation.clients import split_holdout
from fedforge.evaluation.validation import carve_validation
from fedforge.pipeline.named import named_stages
from fedforge.pipeline.pipeline import Pipeline
from fedforge.privacy import parts as privacy
from fedforge.privacy.parts import PrivacyParts
from fedforge.robust.parts import RobustParts, assemble
from fedforge.selection.named import SelectionPolicy, check_sees_losses
from fedforge.selection.sampling import UniformSelection
from fedforge.server import probe
from fedforge.server import proxy as proxy_parts
from fedforge.server.client_lr import LrRule
from fedforge.server.drift_check import drift_fits_task, drift_of
from fedforge.server.engine_choice import EngineChoice, choose_engine, driver_device, ray_choice
from fedforge.store.build_record import data_fingerprint
from fedforge.store.checkpoint import RESIDUAL
from fedforge.store.client_state import ClientStateStore
from fedforge.systems.population import Systems, systems_of
from fedforge.tasks import Task, load_task_data, named_metrics, resolve_task
from fedforge.tasks.metrics import ClassMetrics, Metric, Metrics
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
    # codecs, residuals, groups of cfg.communication
    communication: CommunicationParts | None = None
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
    # which clients each round asks (cfg.selection.policy, selection/named.py)
    selection: SelectionPolicy = dataclasses.field(default_factory=UniformSelection)
    # the figures ``metrics: [...]`` names, by name, recorded at each evaluation
    extra_metrics: tuple[tuple[str, Metric], ...] = ()
    # the clients' system profiles and availability: the virtual clock's (systems/)
    systems: Systems | None = None
    # the server's public proxy set (cfg.proxy, server/proxy.py); None: none
    proxy: proxy_parts.ProxySet | None = None
    # each client's lr scale (cfg.local.lr_rule, server/client_lr.py); None: the plan's lr
    lr_rule: LrRule | None = None
    # the rows each round reads (cfg.drift, data/drift.py): clients train on and the
    # test set is scored on the round's; None: the data does not drift
    drift: DriftSchedule | None = None

    def client_sizes(self) -> np.ndarray:
        """Each client's example count: the partition's; where the clients' rows
        are held elsewhere (a deployment server whose clients bring their own
        data), the counts they declared when they joined (the engine's
        ``declared_sizes``; 0: not joined yet), as one int64 array (no Python
        object a client: a population of 100,000 costs 0.8 MB)."""
        declared = self.engine.declared_sizes()
        if self.data.hosted is not None and declared is not None:
            return np.asarray(declared, dtype=np.int64)
        return np.asarray(self.data.partition.sizes(), dtype=np.int64)

    def client_train_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples client ``client_id`` trains on."""
        fn = self.train_data or self.data.client_data
        return fn(client_id)


def build(cfg: Config, data: FederatedData | None = None, task: Task | None = None) -> Experiment:
    """Assemble a run from its config (``data`` may be given to reuse a load, or as
    the caller's own; ``task``: the caller's, else the config's)."""
    check_names(cfg)  # its plugins loaded, every name registered: before anything loads
    keep_large_blocks()  # glibc: reuse freed activation buffers (fedforge.core.allocator)
    dtype = DTYPES[cfg.dtype]
    device = resolve_device(driver_device(cfg))  # before the data loads: fails fast
    task = resolve_task(cfg, task)
    drift_fits_task(cfg, task)
    own_split = data is not None and not data.split_by_config
    data, model, fingerprint = _run_data(cfg, data, task, dtype)
    data, proxy = proxy_parts.assemble(cfg, data)  # no client holds its rows
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
    algorithm = algorithms.from_config(cfg, dtype=dtype, spec=spec)
    if algorithm.loss_fn is not task.loss():  # the task's loss trains every algorithm
        algorithm = dataclasses.replace(algorithm, loss_fn=task.loss())
    metrics = task.scores()
    parts = _assemble(cfg, data, spec, dtype, algorithm, metrics)
    drift = drift_of(cfg, data, algorithm)
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
        drift=drift,
    )
    if cfg.engine == "ray":  # the per-client tables move to the Ray workers
        tables = _tables(parts.comm, algorithm)
        settings = RaySettings(**dataclasses.asdict(cfg.ray), device=cfg.device)
        driver = _driver_state(parts.priv)
        choice = ray_choice(runtime, tables, settings, driver, cfg.threads, cfg.precision)
    else:
        choice = _engine_for(cfg, data, runtime, _side_state(parts.comm, parts.priv))
    said = [*config_notes(cfg, own_split), own_split_note(cfg) if own_split else None]
    ignored = "; ".join(n for n in said if n)
    # a CPU's bf16: the driver's where it trains, the clients or the proxy's tuning
    # steps (the Ray workers' own CPUs come as the engine's note)
    trains_here = cfg.engine != "ray" or cfg.proxy.tunes
    bf16 = precision_note(cfg.precision) if device == HOST and trains_here else None
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
        _selection(cfg),
        named_metrics.from_config(cfg),
        systems_of(cfg),
        proxy,
        _lr_rule(cfg),
        drift,
    )


def _lr_rule(cfg: Config) -> LrRule | None:
    """The run's per-client lr rule, refused where it reads losses the run hides."""
    name = cfg.local.lr_rule
    if name is None:
        return None
    rule: LrRule = make("lr_rule", name, cfg, "local.lr_rule")
    if cfg.privacy.hides_updates and getattr(rule, "reads_losses", False):
        raise ConfigError(
            f"local.lr_rule = '{name}' scales by the losses clients report, which the run's "
            "privacy keeps from the server; use a rule that reads none (data_size, lr_csv)"
        )
    return rule


def _selection(cfg: Config) -> SelectionPolicy:
    """The run's selection policy, refused where it would rank by hidden losses."""
    policy = make("selection", cfg.selection.policy, cfg, "selection.policy")
    hidden = None
    if cfg.privacy.hides_updates:
        hidden = "privacy.secagg" if cfg.privacy.secagg else "the run's privacy"
    check_sees_losses(policy, cfg.selection.policy, hidden)
    return policy


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
    elif not registry.is_builtin("model", cfg.model) or task.model is not None:  # the caller's
        check_fits(data, model, name)
    fingerprint = fingerprint_of(data)
    data = shift_data(cfg, data)
    if cfg.evaluation.client_tags is not None:  # the CSV's attributes over the data's own
        tagged = load_client_tags(cfg.evaluation.client_tags, cfg.num_clients)
        data = dataclasses.replace(data, tags={**(data.tags or {}), **tagged})
    data.client_tags()  # a data source's tags checked before the first round
    if cfg.evaluation.validation > 0 and data.validation is None:
        ev = cfg.evaluation
        keep, held_out = carve_validation(
            data.partition, ev.validation, ev.validation_split, cfg.seed
        )
        if len(held_out):  # none where the server holds no training rows (clients' own data)
            data = dataclasses.replace(data, partition=keep, validation=held_out)
    if cfg.evaluation.clients and data.holdout is None:  # carve each client's held-out slice
        keep, held = split_holdout(data.partition, cfg.evaluation.holdout, cfg.seed)
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
    kept = algorithm.personal.mask if algorithm.personal is not None else None
    comm = communication_parts.assemble(cfg, spec, dtype, data.partition, data.train_y, kept)
    classes = data.classes() or 0
    robust = assemble(cfg, data.client_data, comm.uplink, classes)
    reporter, weigh = reports.assemble(cfg, robust.data_fn, classes, metrics)  # quality, class
    sizes = [data.num_examples(c) for c in range(cfg.num_clients)]
    priv = privacy.assemble(cfg, sizes)
    privacy.check_algorithm(cfg.privacy, algorithm)
    named = named_stages(cfg, spec, dtype)  # the config's pipeline section
    pipeline = Pipeline(
        aggregator=_weighted(cfg, priv, robust.aggregator),
        client=(*named.client, *comm.client_stages, *priv.client_stages, *robust.client_stages),
        codec=priv.secagg or comm.uplink,  # secure aggregation: the masked update
        server_upload=named.upload,
        cohort=(*robust.cohort_stages, *named.cohort, *weigh),
        server_aggregate=(*priv.aggregate_stages, *named.aggregate),
    )
    communication_parts.check_pipeline(cfg.communication, pipeline)
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
    """The round's aggregator, its weights mapped by ``aggregation.weights`` (which
    rules fit which aggregators: config/compat.py weights_need_plain_mean)."""
    rule = cfg.aggregation.weights
    if rule == "num_examples":  # DP and secure aggregation weigh themselves
        return priv.aggregator or priv.secagg_mean or robust
    if rule == "quality" or rule == "class":  # from the cohort's reports: client/reports.py
        return robust
    return Reweighted(robust, rule, cfg.aggregation.weight_cap)


def client_tables(exp: Experiment) -> dict[str, ClientStateStore]:
    """The run's per-client tables by name (error-feedback ``residual``, SCAFFOLD's
    ``control``): the loop state keeps them and checkpoints save them."""
    return _tables(exp.communication, exp.algorithm)


def _tables(comm: CommunicationParts | None, algorithm: Algorithm) -> dict[str, ClientStateStore]:
    tables: dict[str, ClientStateStore] = {}
    if comm is not None and comm.client_state is not None:
        tables[RESIDUAL] = comm.client_state
    if algorithm.client is not None:
        tables.update(algorithm.client.tables)
    if algorithm.personal is not None:  # FedBN's batch norm
        tables.update(algorithm.personal.tables)
    return tables


def _driver_state(priv: PrivacyParts) -> str | None:
    """What of the clients' side can only live in the driver process (worker
    processes elsewhere would not share it), if anything."""
    if priv.secagg is not None:
        return "secure aggregation's simulated clients share their keys with the server's half"
    if priv.board is not None:
        return "adaptive clipping's clients report to a board in the server process"
    return None


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

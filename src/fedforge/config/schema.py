"""The run configuration: ``Config``, its top-level fields and its sections
(each in the module of its feature: data.py, local.py, evaluation.py,
communication.py, privacy.py, robust.py), and :func:`check`, the one place that
says whether a config can run. Every error names the field and what is allowed.

The words are the paper's (McMahan et al. 2017): ``client_fraction`` is C,
``local_epochs`` is E, ``batch_size`` is B (``null``/"all" means B = infinity,
the client's whole data set in one batch). They stay top-level: the run's own
fields; a component's own fields are in its section (``fedprox``,
``aggregation``, ``server_optimizer``, ``evaluation``), their old top-level
spellings still read (moved.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fedforge.config import compat, moved
from fedforge.config import task as task_rules
from fedforge.config.aggregation import AggregationConfig
from fedforge.config.alerts import AlertsConfig, budget_rules_need_budget
from fedforge.config.asynchronous import AsynchronousConfig, buffered_fits
from fedforge.config.bounds import (
    MAX_CLIENTS,
    MAX_EXAMPLES,
    MAX_ROUNDS,
    MAX_STEPS,
    SEED_BITS,
    check_bounds,
    refused_window_fits_run,
)
from fedforge.config.client_lr import client_lr_fits
from fedforge.config.communication import CommunicationConfig
from fedforge.config.data import SCALINGS, Dataset, InputScaling, PartitionConfig, SyntheticConfig
from fedforge.config.deployment import DeploymentConfig, remote_data_fits
from fedforge.config.drift import DriftConfig, drift_fits
from fedforge.config.evaluation import DiagnosticsConfig, EvaluationConfig
from fedforge.config.local import (
    FedProxConfig,
    LocalConfig,
    LocalParamsConfig,
    PerFedAvgConfig,
    ScaffoldConfig,
    StragglerConfig,
    step_limit,
)
from fedforge.config.names import check_registered
from fedforge.config.pipeline import PipelineConfig
from fedforge.config.privacy import PrivacyConfig
from fedforge.config.proxy import ProxyConfig, proxy_fits
from fedforge.config.ranges import Most, Range, check_ranges
from fedforge.config.ray import RayConfig
from fedforge.config.robust import RobustConfig
from fedforge.config.selection import SelectionConfig, policy_fits_privacy
from fedforge.config.server_optimizer import ServerOptimizerConfig
from fedforge.config.systems import SystemsConfig, systems_fit_run
from fedforge.core.device import DEVICE_NAMES, is_device_name
from fedforge.core.errors import FieldCheck, raise_first
from fedforge.core.errors import invalid_field as invalid  # noqa: F401  (parse.py's)

_STEP = "must be a number > 0 (below 3.4e38 in a float32 run)"

# The names of registered components (core/registry.py): checked against the
# registry's names when a config is checked (check_registered), after its plugins load
AlgorithmName = str  # fedavg, fedsgd, fedprox, scaffold, fedbn, perfedavg or a plugin's
ModelName = str  # a built-in model or one given to fedforge.register_model
EngineName = Literal["auto", "serial", "vectorized", "ray"]
DType = Literal["float32", "float64"]
Precision = Literal["fp32", "bf16"]
DeviceName = str  # cpu, cuda, cuda:N or auto (core/device.py)


# torch intra-op threads a process may ask for (a million crashed torch's pool)
MAX_THREADS = 1024


@dataclass(frozen=True)
class Config:
    """One run. Frozen: derive a changed copy with :func:`override`."""

    name: str = "run"
    seed: Annotated[int, Most((1 << SEED_BITS) - 1, "a 64-bit seed", least=-(1 << SEED_BITS))] = 0
    # a built-in task (config/task.py) or one given to fedforge.register_task; it
    # sets dataset and model, which stay a shorthand for it (null: dataset + model)
    task: str | None = None
    dataset: Dataset = "mnist"
    # standard: the data set's own preprocessing; unit: MNIST pixels in [0, 1];
    # raw: the values as stored (config/data.py says what each is per data set)
    input_scaling: InputScaling = "standard"
    data_dir: str | None = None
    model: ModelName = "cnn"
    algorithm: AlgorithmName = "fedavg"
    num_clients: Annotated[int, Range(">= 1"), Most(MAX_CLIENTS, "clients")] = 100
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    # the clients' data moving with the round: label maps or mixes by phase (config/drift.py)
    drift: DriftConfig = field(default_factory=DriftConfig)
    client_fraction: Annotated[float, Range("(0, 1]")] = 0.1
    local_epochs: Annotated[
        int, Range(">= 1"), Most(MAX_STEPS, "passes over a client's data a round")
    ] = 1
    batch_size: Annotated[
        int | None,
        Range(">= 1", null="or 'all': the whole client data set"),
        Most(MAX_EXAMPLES, "examples a batch"),
    ] = 10
    lr: float = 0.1
    lr_decay: Annotated[float, Range("(0, 1]")] = 1.0  # local lr at round t is lr * lr_decay**t
    # the weighted mean's weight per client (config/aggregation.py)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    # the server's step on the aggregate (its lr: 1.0 with sgd is FedAvg)
    server_optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    # which clients each round asks: a registered policy (selection/named.py)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)
    communication: CommunicationConfig = field(default_factory=CommunicationConfig)
    # stages added by name (fedforge.register_stage): config/pipeline.py says where
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    fedprox: FedProxConfig = field(default_factory=FedProxConfig)  # its proximal mu
    scaffold: ScaffoldConfig = field(default_factory=ScaffoldConfig)
    perfedavg: PerFedAvgConfig = field(default_factory=PerFedAvgConfig)
    # entries each client keeps, with any algorithm (FedBN's batch norm, a subset)
    local_params: LocalParamsConfig = field(default_factory=LocalParamsConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    systems: SystemsConfig = field(default_factory=SystemsConfig)
    # synchronous rounds, or buffered asynchronous aggregation (FedBuff)
    asynchronous: AsynchronousConfig = field(default_factory=AsynchronousConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)  # the server's public proxy set
    rounds: Annotated[int, Range(">= 1"), Most(MAX_ROUNDS, "rounds")] = 60
    target_accuracy: Annotated[
        float | None, Range("(0, 1]", note="a fraction, e.g. 0.99", null="")
    ] = 0.99
    # when and what the global model is evaluated on (config/evaluation.py)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    # rounds between checkpoints; 0 = only on SIGINT/SIGTERM
    checkpoint_every: Annotated[
        int, Range(">= 0", note="0 turns periodic checkpoints off"), Most(MAX_ROUNDS, "rounds")
    ] = 10
    # auto: vectorized where it is the faster (models without convolutions) and allowed
    engine: EngineName = "auto"
    # processes the cohort is spread over (engines/pool.py); 0: one per core
    workers: Annotated[int, Range(">= 0", note="0: one per core"), Most(1024, "processes")] = 1
    # engine: ray's cluster and workers (config/ray.py)
    ray: RayConfig = field(default_factory=RayConfig)
    # torch intra-op threads of each process of the run; null: the usable cores
    # divided among the run's processes (engines/threads.py)
    threads: Annotated[
        int | None,
        Range(
            f"[1, {MAX_THREADS}]",
            note="torch threads of each process of the run",
            null="the usable cores divided among the run's processes",
        ),
        Most(MAX_THREADS, "torch threads"),  # torch cannot start a million
    ] = None
    dtype: DType = "float32"
    precision: Precision = "fp32"  # bf16: local forward passes under bf16 autocast
    # where local training and evaluation run (core/device.py); the global vector,
    # aggregation, the pipeline's stages and the run store stay on the host
    device: DeviceName = "cpu"
    runs_dir: str = "runs"
    # fedforge server: waiting for clients, deadlines, over-selection (transport/)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
    # rules watched after every round, and what each does when it fires (alerts/)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    # modules or .py files to import (each registers its components), once each,
    # before the config's names are checked against the registry
    plugins: tuple[str, ...] = ()
    # a plugin's options under its name, e.g. {fedavgm: {beta: 0.9}}: parsed by the
    # options dataclass the plugin registered (config/components.py)
    plugin_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        task_rules.check_task_name(self.task)
        dataset, model = task_rules.task_data(self.task, self.dataset, self.model)
        object.__setattr__(self, "dataset", dataset)
        object.__setattr__(self, "model", model)
        if self.algorithm == "fedsgd":
            # FedSGD is FedAvg with E = 1 and B = infinity; store what really runs.
            object.__setattr__(self, "local_epochs", 1)
            object.__setattr__(self, "batch_size", None)
        if self.algorithm == "perfedavg":
            # Per-FedAvg's local work is perfedavg.steps meta-steps, not epochs.
            object.__setattr__(self, "local_epochs", 1)
        check(self)


# Config(...) also takes a moved field's old spelling (mu=0.1), put in its section
_dataclass_init = Config.__init__


def _init(self: Config, *args: Any, **kwargs: Any) -> None:
    kwargs, said = moved.moved_kwargs(Config, kwargs)
    _dataclass_init(self, *args, **kwargs)
    moved.remember(self, said)


Config.__init__ = _init  # type: ignore[method-assign]


def check(cfg: Config) -> None:
    """Whether ``cfg`` can run: the run's own fields, each section's fields, then
    how the sections combine (compat.py), in that order; the first problem
    raises ConfigError naming the field."""
    check_registered(cfg)
    check_ranges(cfg, "", nested=False)  # the sections in their order below
    _check_run(cfg)
    sections = (
        cfg.partition,
        cfg.drift,
        cfg.aggregation,
        cfg.server_optimizer,
        cfg.selection,
        cfg.robust,
        cfg.communication,
        cfg.pipeline,
        cfg.privacy,
        cfg.fedprox,
        cfg.scaffold,
        cfg.perfedavg,
        cfg.local_params,
        cfg.evaluation,
        cfg.local,
        cfg.stragglers,
        cfg.diagnostics,
        cfg.synthetic,
        cfg.deployment,
        cfg.alerts,
        cfg.asynchronous,
        cfg.systems,
        cfg.ray,
        cfg.proxy,
    )
    names = {id(getattr(cfg, f.name)): f.name for f in dataclasses.fields(cfg)}
    for section in sections:
        check_ranges(section, names[id(section)] + ".")
        rules = getattr(section, "check", None)  # rules between its fields, if any
        if rules is not None:
            rules()
    check_bounds(cfg)
    refused_window_fits_run(cfg)
    # how the sections combine: training and data first, then the parts a run is
    # built of in the order they are built (robustness, privacy, weights, edges)
    compat.groups_within_clients(cfg.communication, cfg.num_clients)
    compat.personal_eval_needs_client_eval(cfg.evaluation)
    compat.client_tags_need_client_eval(cfg.evaluation)
    compat.declared_sizes_need_a_cap(
        cfg.deployment.client_data, cfg.robust.max_weight_ratio, cfg.aggregation.weights
    )
    compat.perfedavg_plain_sgd(cfg.algorithm, cfg.local)
    compat.perfedavg_personal_lr(cfg.algorithm, cfg.perfedavg, cfg.evaluation.personal)
    compat.perfedavg_no_stragglers(cfg.algorithm, cfg.stragglers)  # before the epochs' check
    compat.perfedavg_model(cfg.algorithm, cfg.model, cfg.precision)
    compat.steps_fit_dtype(cfg.local, cfg.lr, cfg.dtype)
    compat.proximal_step_fits_dtype(cfg.fedprox, cfg.lr, cfg.dtype)
    compat.stragglers_need_epochs(cfg.stragglers, cfg.local_epochs)
    compat.feature_shift_needs_images(cfg.partition, cfg.dataset)
    task_rules.model_fits_dataset(cfg.model, cfg.dataset, cfg.task)
    task_rules.natural_needs_own_clients(cfg.partition, cfg.dataset)
    task_rules.labels_fit_features(
        cfg.dataset,
        cfg.partition,
        cfg.aggregation.weights,
        cfg.robust,
        cfg.communication.group_by if cfg.communication.groups else "none",
    )
    compat.feature_shift_needs_standard_scaling(cfg.partition, cfg.input_scaling)
    drift_fits(
        cfg.drift,
        cfg.dataset,
        cfg.deployment.client_data,
        cfg.evaluation.clients,
        cfg.diagnostics.loss_gap,
        cfg.evaluation.validation,
        cfg.robust.client_gate,
        cfg.aggregation.weights,
        cfg.asynchronous.buffered,
        cfg.proxy.tunes,
        cfg.deployment.canary_every,
        cfg.deployment.cold_start,
        cfg.communication.upload_every,
    )
    compat.attack_needs_floats(cfg.robust, cfg.privacy)
    compat.robust_fits_cohort(cfg.robust, cfg.num_clients, cfg.client_fraction)
    compat.delta_below_one_over_n(cfg.privacy, cfg.num_clients)
    compat.secagg_can_hide(cfg.privacy, cfg.communication)
    compat.over_selection_without_dp(cfg.deployment.over_selection, cfg.privacy)
    policy_fits_privacy(cfg.selection, cfg.privacy)
    systems_fit_run(
        cfg.systems,
        cfg.privacy.dp,
        cfg.privacy.tiers.enabled,
        bool(cfg.privacy.secagg),
        cfg.communication.upload_every,
    )
    compat.secagg_neighbours_fit_cohort(cfg.privacy, cfg.num_clients, cfg.client_fraction)
    compat.one_clip(cfg.privacy, cfg.communication)
    client_lr_fits(
        cfg.local.lr_rule,
        cfg.communication.clip_multiple,
        cfg.asynchronous.buffered,
        cfg.privacy.dp,
        cfg.privacy.tiers.enabled,
        bool(cfg.privacy.secagg),
    )
    compat.dp_noise_needs_mean(cfg.privacy, cfg.robust)
    compat.client_gate_outside_dp(cfg.robust, cfg.privacy)
    compat.weights_need_plain_mean(cfg.aggregation.weights, cfg.privacy, cfg.robust)
    compat.groups_need_example_weights(cfg.communication, cfg.aggregation.weights)
    compat.central_dp_needs_dense_uplink(cfg.privacy, cfg.communication)
    compat.groups_exclude_central_dp(cfg.communication, cfg.privacy)
    budget_rules_need_budget(cfg.alerts, cfg.privacy.target_epsilon)
    buffered_fits(
        cfg.asynchronous,
        cfg.num_clients,
        cfg.client_fraction,
        cfg.algorithm,
        cfg.privacy,
        cfg.robust,
        cfg.communication,
        cfg.stragglers,
        cfg.diagnostics,
    )
    proxy_fits(cfg.proxy, cfg.privacy, cfg.deployment, cfg.asynchronous)
    remote_data_fits(
        cfg.deployment,
        cfg.partition,
        cfg.evaluation.clients,
        cfg.diagnostics,
        cfg.robust,
        cfg.communication,
        cfg.privacy,
    )


def _check_run(cfg: Config) -> None:
    """The run's own (top-level) fields."""
    step_max = step_limit(cfg.dtype)
    checks: list[FieldCheck] = [
        ("lr", cfg.lr, 0.0 < cfg.lr < step_max, _STEP),
        (  # which names exist is the registry's, checked when a run is built (a
            # stored config naming a model of the caller's stays readable without it)
            "model",
            cfg.model,
            isinstance(cfg.model, str) and bool(cfg.model.strip()),
            "must be a model name: 2nn, cnn, cnn_bn, logreg, or one given to "
            "fedforge.register_model",
        ),
        (
            "precision",
            cfg.precision,
            cfg.precision == "fp32" or cfg.dtype == "float32",
            f"must be 'fp32' with dtype {cfg.dtype!r} (bf16 keeps float32 master weights)",
        ),
        ("device", cfg.device, is_device_name(cfg.device), f"must be {DEVICE_NAMES}"),
        (
            "server_optimizer.lr",
            cfg.server_optimizer.lr,
            0.0 < cfg.server_optimizer.lr < step_max,
            _STEP,
        ),
        (
            "name",
            cfg.name,
            _run_name_ok(cfg.name),
            "must be 1-200 printable characters without '/' or '\\' (it names the run's folder)",
        ),
        ("runs_dir", cfg.runs_dir, bool(cfg.runs_dir.strip()), "must be a non-empty path"),
        _scaling_check(cfg),
    ]
    raise_first("", checks)


def _scaling_check(cfg: Config) -> FieldCheck:
    """``input_scaling`` is one the data set has (Synthetic has no pixels to put in [0, 1])."""
    allowed = SCALINGS.get(cfg.dataset, ("standard",))
    return (
        "input_scaling",
        cfg.input_scaling,
        cfg.input_scaling in allowed,
        "must be one of " + ", ".join(repr(a) for a in allowed) + f" with dataset {cfg.dataset!r}",
    )


def _run_name_ok(name: str) -> bool:
    """A run's name goes into its folder's name (after a 23-character date and id,
    within the usual 255-byte limit) and into one-line tables."""
    return 0 < len(name.encode()) <= 200 and name.isprintable() and not set(name) & {"/", "\\"}

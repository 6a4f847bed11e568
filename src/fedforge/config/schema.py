"""The run configuration's schema: typed, frozen sections, each value checked
with an error naming the field and what is allowed.

The words are the paper's (McMahan et al. 2017): ``client_fraction`` is C,
``local_epochs`` is E, ``batch_size`` is B (``null``/"all" means B = infinity,
the client's whole data set in one batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from fedforge.config.noniid import (
    DiagnosticsConfig,
    LocalConfig,
    ScaffoldConfig,
    StragglerConfig,
    SyntheticConfig,
    step_limit,
    validate_noniid,
)
from fedforge.config.personal import PerFedAvgConfig, PersonalEvalConfig, validate_personal
from fedforge.config.privacy import PrivacyConfig, validate_privacy
from fedforge.config.robust import RobustConfig, validate_robust
from fedforge.core.errors import invalid_field as invalid

WeightRule = Literal["num_examples", "uniform", "sqrt", "capped", "quality", "class"]
_STEP = "must be a number > 0 (below 3.4e38 in a float32 run)"

PartitionKind = Literal["iid", "shards", "dirichlet", "hsu", "quantity"]
# feature-shift domains of data/shift.py and label-noise rules of data/noise.py
FeatureDomain = Literal["none", "rotation", "invert", "contrast", "blur", "noise", "scale"]
LabelNoiseRule = Literal["symmetric", "pair"]
Algorithm = Literal["fedavg", "fedsgd", "fedprox", "scaffold", "fedbn", "perfedavg"]
ModelName = str  # a built-in model or one given to fedforge.register_model
Dataset = Literal["mnist", "synthetic"]
Engine = Literal["auto", "serial", "vectorized"]
DType = Literal["float32", "float64"]
Precision = Literal["fp32", "bf16"]


@dataclass(frozen=True)
class PartitionConfig:
    """How the training set is split over clients."""

    kind: PartitionKind = "iid"
    shards_per_client: int = 2  # shards: McMahan's 200 shards of 300 = 2 per client
    alpha: float = 0.5  # dirichlet, hsu: label-skew concentration (> 0)
    sigma: float = 1.0  # quantity: lognormal sigma of client sizes (>= 0)
    min_size: int = 1  # dirichlet/quantity: smallest client allowed
    # FedBN's feature shift: domains dealt over the clients, one each; () = off
    feature_shift: tuple[FeatureDomain, ...] = ()
    label_noise: float = 0.0  # fraction of clients whose labels are noisy
    label_noise_rule: LabelNoiseRule = "symmetric"  # symmetric: another class; pair: y + 1
    label_noise_rate: float = 1.0  # of a noisy client's examples, the fraction relabelled


ServerOptimizerKind = Literal["sgd", "adagrad", "adam", "yogi"]


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """How the server applies the aggregated delta (Reddi et al. 2021). ``sgd``
    with ``momentum`` 0 and ``server_lr`` 1 is FedAvg; momentum > 0 is FedAvgM."""

    kind: ServerOptimizerKind = "sgd"
    momentum: float = 0.0  # sgd only
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3  # adaptivity: added to sqrt(v)
    bias_correction: bool = False  # True: torch.optim.Adam's form


UplinkCodec = Literal[
    "dense", "float16", "bfloat16", "int8", "int4", "int2", "sign", "topk", "randk"
]
DownlinkCodec = Literal["dense", "float16", "bfloat16", "int8", "int4"]


@dataclass(frozen=True)
class CommunicationConfig:
    """What travels and how often (see fedforge.compression.quantize, .sparsify,
    .feedback, .clip and fedforge.server.collectors.hierarchical)."""

    uplink: UplinkCodec = "dense"  # the codec of client updates
    downlink: DownlinkCodec = "dense"  # the codec of the payload (the global model)
    rounding: Literal["stochastic", "nearest"] = "stochastic"  # int*, sign
    scale: Literal["chunk", "tensor"] = "chunk"  # int*, sign: one scale per chunk or tensor
    chunk_size: int = 1024  # scale: chunk
    fraction: float = 0.01  # topk, randk: p, the fraction of coordinates sent
    randk_per_client: bool = False  # randk: a set per client (false: one per round, linear)
    error_feedback: bool = False  # keep what the uplink codec dropped, add it next time
    clip_norm: float | None = None  # clip each delta to this L2 norm; null = off
    upload_every: int = 1  # k: a cohort trains k rounds locally, then uploads once
    groups: int = 0  # hierarchical aggregation over this many edge groups; 0 = off
    group_by: Literal["contiguous", "label"] = "contiguous"  # client -> group


@dataclass(frozen=True)
class Config:
    """One run. Frozen: derive a changed copy with :func:`override`."""

    name: str = "run"
    seed: int = 0
    dataset: Dataset = "mnist"
    data_dir: str | None = None
    model: ModelName = "cnn"
    algorithm: Algorithm = "fedavg"
    num_clients: int = 100
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    client_fraction: float = 0.1
    local_epochs: int = 1
    batch_size: int | None = 10
    lr: float = 0.1
    lr_decay: float = 1.0  # local lr at round t is lr * lr_decay**t
    server_lr: float = 1.0  # server SGD on the pseudo-gradient; 1.0 is FedAvg
    # the weighted mean's weight per client: num_examples, uniform, sqrt, capped,
    # quality (num_examples x exp(-validation loss / T)), class (sum_c n_kc / N_c)
    aggregation_weights: WeightRule = "num_examples"
    weight_cap: int | None = None  # capped: min(num_examples, weight_cap)
    quality_temperature: float = 1.0  # quality: T of exp(-loss / T)
    quality_holdout: float = 0.1  # quality: each client's validation split (not trained on)
    server_optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)
    communication: CommunicationConfig = field(default_factory=CommunicationConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    mu: float = 0.01  # fedprox: the proximal coefficient (the paper's grid 0.001..1)
    local: LocalConfig = field(default_factory=LocalConfig)
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    scaffold: ScaffoldConfig = field(default_factory=ScaffoldConfig)
    perfedavg: PerFedAvgConfig = field(default_factory=PerFedAvgConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    rounds: int = 60
    target_accuracy: float | None = 0.99
    eval_every: int = 1
    eval_clients: bool = False  # also evaluate on each client's held-out slice (clienteval.py)
    eval_holdout: float = 0.2  # eval_clients: the fraction of each client's data held out
    # eval_clients: also score each client after a few local steps (personal.py)
    personal_eval: PersonalEvalConfig = field(default_factory=PersonalEvalConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    eval_batch_size: int = 250  # small batches stay in cache: 2x faster than 2000 (CNN)
    checkpoint_every: int = 10  # rounds between checkpoints; 0 = only on SIGINT/SIGTERM
    # auto: vectorized where it is the faster (models without convolutions) and allowed
    engine: Engine = "auto"
    workers: int = 1  # processes the cohort is spread over (engines/pool.py); 0: one per core
    dtype: DType = "float32"
    precision: Precision = "fp32"  # bf16: local forward passes under bf16 autocast
    runs_dir: str = "runs"

    def __post_init__(self) -> None:
        if self.algorithm == "fedsgd":
            # FedSGD is FedAvg with E = 1 and B = infinity; store what really runs.
            object.__setattr__(self, "local_epochs", 1)
            object.__setattr__(self, "batch_size", None)
        if self.algorithm == "perfedavg":
            # Per-FedAvg's local work is perfedavg.steps meta-steps, not epochs.
            object.__setattr__(self, "local_epochs", 1)
        _validate(self)
        _validate_communication(self)
        validate_privacy(self.privacy)
        validate_personal(self)  # first: it says why stragglers cannot run with perfedavg
        validate_noniid(self)


def describe_split(cfg: Config) -> str:
    """How the run's data is spread over clients, as the CLI and ``show`` print it."""
    if cfg.dataset == "synthetic":  # its users are its clients: no partition
        syn = cfg.synthetic
        return "Synthetic-IID users" if syn.iid else f"Synthetic({syn.alpha}, {syn.beta}) users"
    part = cfg.partition
    detail = {
        "shards": f"{part.shards_per_client} shards/client",
        "dirichlet": f"alpha={part.alpha}",
        "hsu": f"alpha={part.alpha}",
        "quantity": f"sigma={part.sigma}",
    }.get(part.kind)
    return f"{part.kind} partition" + (f" ({detail})" if detail else "")


def _validate(cfg: Config) -> None:
    step_max = step_limit(cfg)
    checks: list[tuple[str, Any, bool, str]] = [
        ("num_clients", cfg.num_clients, cfg.num_clients >= 1, "must be an integer >= 1"),
        (
            "client_fraction",
            cfg.client_fraction,
            0.0 < cfg.client_fraction <= 1.0,
            "must be in (0, 1]",
        ),
        ("local_epochs", cfg.local_epochs, cfg.local_epochs >= 1, "must be an integer >= 1"),
        (
            "batch_size",
            cfg.batch_size,
            cfg.batch_size is None or cfg.batch_size >= 1,
            "must be an integer >= 1, or null/'all' for the whole client data set",
        ),
        ("lr", cfg.lr, 0.0 < cfg.lr < step_max, _STEP),
        (  # which names exist is the registry's, checked when a run is built (a
            # stored config naming a model of the caller's stays readable without it)
            "model",
            cfg.model,
            isinstance(cfg.model, str) and bool(cfg.model.strip()),
            "must be a model name: 2nn, cnn, cnn_bn, logreg, or one given to "
            "fedforge.register_model",
        ),
        ("workers", cfg.workers, cfg.workers >= 0, "must be an integer >= 0 (0: one per core)"),
        (
            "precision",
            cfg.precision,
            cfg.precision == "fp32" or cfg.dtype == "float32",
            f"must be 'fp32' with dtype {cfg.dtype!r} (bf16 keeps float32 master weights)",
        ),
        ("lr_decay", cfg.lr_decay, 0.0 < cfg.lr_decay <= 1.0, "must be in (0, 1]"),
        ("server_lr", cfg.server_lr, 0.0 < cfg.server_lr < step_max, _STEP),
        ("rounds", cfg.rounds, cfg.rounds >= 1, "must be an integer >= 1"),
        (
            "target_accuracy",
            cfg.target_accuracy,
            cfg.target_accuracy is None or 0.0 < cfg.target_accuracy <= 1.0,
            "must be in (0, 1] (a fraction, e.g. 0.99), or null",
        ),
        ("eval_every", cfg.eval_every, cfg.eval_every >= 1, "must be an integer >= 1"),
        (
            "eval_batch_size",
            cfg.eval_batch_size,
            cfg.eval_batch_size >= 1,
            "must be an integer >= 1",
        ),
        (
            "checkpoint_every",
            cfg.checkpoint_every,
            cfg.checkpoint_every >= 0,
            "must be an integer >= 0 (0 turns periodic checkpoints off)",
        ),
        (
            "name",
            cfg.name,
            _run_name_ok(cfg.name),
            "must be 1-200 printable characters without '/' or '\\' (it names the run's folder)",
        ),
        ("runs_dir", cfg.runs_dir, bool(cfg.runs_dir.strip()), "must be a non-empty path"),
        (
            "partition.shards_per_client",
            cfg.partition.shards_per_client,
            cfg.partition.shards_per_client >= 1,
            "must be an integer >= 1",
        ),
        (
            "server_optimizer.momentum",
            cfg.server_optimizer.momentum,
            0.0 <= cfg.server_optimizer.momentum < 1.0,
            "must be in [0, 1)",
        ),
        (
            "server_optimizer.beta1",
            cfg.server_optimizer.beta1,
            0.0 <= cfg.server_optimizer.beta1 < 1.0,
            "must be in [0, 1)",
        ),
        (
            "server_optimizer.beta2",
            cfg.server_optimizer.beta2,
            0.0 <= cfg.server_optimizer.beta2 < 1.0,
            "must be in [0, 1)",
        ),
        (
            "server_optimizer.tau",
            cfg.server_optimizer.tau,
            cfg.server_optimizer.tau > 0,
            "must be > 0",
        ),
        ("partition.alpha", cfg.partition.alpha, cfg.partition.alpha > 0.0, "must be > 0"),
        ("partition.sigma", cfg.partition.sigma, cfg.partition.sigma >= 0.0, "must be >= 0"),
        (
            "partition.min_size",
            cfg.partition.min_size,
            cfg.partition.min_size >= 1,
            "must be an integer >= 1",
        ),
    ]
    for name, value, ok, allowed in checks:
        if not ok:
            raise invalid(name, value, allowed)
    validate_robust(cfg.robust)


def _run_name_ok(name: str) -> bool:
    """A run's name goes into its folder's name (after a 23-character date and id,
    within the usual 255-byte limit) and into one-line tables."""
    return 0 < len(name.encode()) <= 200 and name.isprintable() and not set(name) & {"/", "\\"}


def _validate_communication(cfg: Config) -> None:
    com = cfg.communication
    checks: list[tuple[str, Any, bool, str]] = [
        ("chunk_size", com.chunk_size, com.chunk_size >= 1, "must be an integer >= 1"),
        (
            "fraction",
            com.fraction,
            0.0 < com.fraction <= 1.0,
            "must be in (0, 1] (top-k/random-k keep max(1, floor(fraction * P)) coordinates)",
        ),
        (
            "clip_norm",
            com.clip_norm,
            com.clip_norm is None or com.clip_norm > 0.0,
            "must be a number > 0, or null (no clipping)",
        ),
        ("upload_every", com.upload_every, com.upload_every >= 1, "must be an integer >= 1"),
        (
            "groups",
            com.groups,
            0 <= com.groups <= cfg.num_clients,
            f"must be 0 (off) or 1..num_clients ({cfg.num_clients})",
        ),
        (
            "error_feedback",
            com.error_feedback,
            not com.error_feedback or com.uplink != "dense",
            "needs a lossy uplink codec (dense drops nothing); allowed with: "
            "float16, bfloat16, int8, int4, int2, sign, topk, randk",
        ),
        (
            "error_feedback",
            com.error_feedback,
            not com.error_feedback
            or com.rounding == "nearest"
            or com.uplink not in ("sign", "int2"),
            f"with uplink '{com.uplink}' needs rounding: nearest (stochastic {com.uplink} "
            "loses more than its input, ||C(x) - x|| > ||x||, and the residual grows without "
            "bound: measured x2 a round; Karimireddy et al.'s scaled sign is the nearest one)",
        ),
    ]
    for name, value, ok, allowed in checks:
        if not ok:
            raise invalid("communication." + name, value, allowed)

"""Config sections of the non-IID toolkit (issue 4): local training knobs,
stragglers, FedProx's mu, SCAFFOLD's control update, the Synthetic(alpha,
beta) data set of FedProx, feature-shift and label-noise partitions, and the
quality weights. Checked with errors that name the field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fedforge.core.errors import invalid_field as invalid

if TYPE_CHECKING:
    from fedforge.config.schema import Config


@dataclass(frozen=True)
class LocalConfig:
    """Local optimizer knobs, the same in every engine (algorithms/local.py)."""

    momentum: float = 0.0  # heavy-ball momentum, as torch.optim.SGD (dampening 0)
    weight_decay: float = 0.0  # L2 term added to the gradient, as torch.optim.SGD
    grad_clip: float | None = None  # clip each step's gradient to this L2 norm; null = off


@dataclass(frozen=True)
class StragglerConfig:
    """Systems heterogeneity as in FedProx (Li et al. 2020, section 5.2)."""

    fraction: float = 0.0  # of each cohort, drawn from the seed, doing fewer epochs
    drop: bool | None = None  # drop stragglers' work; null = the algorithm's default


@dataclass(frozen=True)
class ScaffoldConfig:
    """SCAFFOLD's client control update (Karimireddy et al. 2020, Algorithm 1)."""

    option: Literal["I", "II"] = "II"  # I: full local gradient at x; II: from the steps


@dataclass(frozen=True)
class SyntheticConfig:
    """Synthetic(alpha, beta) of FedProx (dataset: synthetic; num_clients users)."""

    alpha: float = 1.0  # std of the per-client model means (model heterogeneity)
    beta: float = 1.0  # std of the per-client feature means (data heterogeneity)
    iid: bool = False  # Synthetic-IID: one W, b for all, features N(0, Sigma)
    test_fraction: float = 0.1  # of each client's samples held out (the official 90/10)


@dataclass(frozen=True)
class DiagnosticsConfig:
    """Drift diagnostics logged every round (server/diagnostics.py)."""

    updates: bool = True  # mean pairwise cosine and norms of the cohort's updates
    # the global model's loss on each cohort client's data: an extra no-grad pass
    # over the cohort's data every round, so off by default
    loss_gap: bool = False
    # warn once when the mean cosine stays below this ... (IID MNIST at E = 1,
    # B = 10 measures ~0.09: SGD noise in many dimensions; below 0 the cohort's
    # updates disagree on average)
    low_cosine: float = 0.0
    low_cosine_rounds: int = 3  # ... for this many rounds in a row


def step_limit(cfg: Config) -> float:
    """The largest step-size product a run's dtype holds (float32's: 3.4e38)."""
    return 3.4028234663852886e38 if cfg.dtype == "float32" else math.inf


def validate_noniid(cfg: Config) -> None:
    """Check the issue-4 fields of ``cfg`` (and how they combine)."""
    loc, strag, syn, part = cfg.local, cfg.stragglers, cfg.synthetic, cfg.partition
    shift = part.feature_shift
    # float32 runs step by lr * mu and lr * weight_decay: past its largest value
    # round 1 failed converting them (3.4e38)
    top = step_limit(cfg)
    checks: list[tuple[str, Any, bool, str]] = [
        (
            "mu",
            cfg.mu,
            cfg.mu >= 0.0 and cfg.mu * max(cfg.lr, 1.0) < top,
            "must be a number >= 0 (FedProx's proximal coefficient; lr * mu below 3.4e38 "
            "in a float32 run)",
        ),
        ("local.momentum", loc.momentum, 0.0 <= loc.momentum < 1.0, "must be in [0, 1)"),
        (
            "local.weight_decay",
            loc.weight_decay,
            loc.weight_decay >= 0.0 and loc.weight_decay * max(cfg.lr, 1.0) < top,
            "must be >= 0 (lr * weight_decay below 3.4e38 in a float32 run)",
        ),
        (
            "local.grad_clip",
            loc.grad_clip,
            loc.grad_clip is None or loc.grad_clip > 0.0,
            "must be a number > 0, or null (no clipping)",
        ),
        ("stragglers.fraction", strag.fraction, 0.0 <= strag.fraction <= 1.0, "must be in [0, 1]"),
        (
            "stragglers.fraction",
            strag.fraction,
            strag.fraction == 0.0 or cfg.local_epochs >= 2,
            f"needs local_epochs >= 2 (stragglers do 1..E-1 epochs; E = {cfg.local_epochs})",
        ),
        ("eval_holdout", cfg.eval_holdout, 0.0 < cfg.eval_holdout < 1.0, "must be in (0, 1)"),
        (
            "diagnostics.low_cosine",
            cfg.diagnostics.low_cosine,
            -1.0 <= cfg.diagnostics.low_cosine <= 1.0,
            "must be in [-1, 1]",
        ),
        (
            "diagnostics.low_cosine_rounds",
            cfg.diagnostics.low_cosine_rounds,
            cfg.diagnostics.low_cosine_rounds >= 1,
            "must be an integer >= 1",
        ),
        (
            "weight_cap",
            cfg.weight_cap,
            (cfg.weight_cap is None or cfg.weight_cap >= 1)
            and (cfg.aggregation_weights != "capped" or cfg.weight_cap is not None),
            "must be an integer >= 1 (and is needed by aggregation_weights = 'capped')",
        ),
        ("synthetic.alpha", syn.alpha, syn.alpha >= 0.0, "must be >= 0"),
        ("synthetic.beta", syn.beta, syn.beta >= 0.0, "must be >= 0"),
        (
            "synthetic.test_fraction",
            syn.test_fraction,
            0.0 < syn.test_fraction < 1.0,
            "must be in (0, 1)",
        ),
        (
            "model",
            cfg.model,
            cfg.dataset != "synthetic" or cfg.model not in ("2nn", "cnn", "cnn_bn"),
            "dataset 'synthetic' (60 features) needs model 'logreg' (or one of your own)",
        ),
        (
            "partition.feature_shift",
            list(shift),
            len(set(shift)) == len(shift),
            "must name each domain once (domains are dealt over the clients in turn)",
        ),
        (
            "partition.feature_shift",
            list(shift),
            not shift or cfg.dataset == "mnist",
            "needs dataset 'mnist' (the domains transform 28x28 images); use [] with "
            f"dataset {cfg.dataset!r}",
        ),
        (
            "partition.label_noise",
            part.label_noise,
            0.0 <= part.label_noise <= 1.0,
            "must be in [0, 1] (the fraction of clients with noisy labels)",
        ),
        (
            "partition.label_noise_rate",
            part.label_noise_rate,
            0.0 < part.label_noise_rate <= 1.0,
            "must be in (0, 1] (the fraction of a noisy client's labels that are wrong)",
        ),
        (
            "quality_temperature",
            cfg.quality_temperature,
            cfg.quality_temperature > 0.0,
            "must be a number > 0 (T of exp(-loss / T))",
        ),
        (
            "quality_holdout",
            cfg.quality_holdout,
            0.0 < cfg.quality_holdout < 1.0,
            "must be in (0, 1) (each client's validation split)",
        ),
    ]
    for name, value, ok, allowed in checks:
        if not ok:
            raise invalid(name, value, allowed)

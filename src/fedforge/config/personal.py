"""Config sections of personalisation (issue 4, item 4): Per-FedAvg's local
meta-update (Fallah et al. 2020) and the personalised evaluation that lets every
algorithm's global model be adapted by a few local steps before each client's
held-out slice is scored (FedAvg + fine-tuning is FedAvg with it on). Checked
with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fedforge.core.errors import invalid_field as invalid

if TYPE_CHECKING:
    from fedforge.config.schema import Config


@dataclass(frozen=True)
class PerFedAvgConfig:
    """Per-FedAvg's local meta-update (algorithms/perfedavg.py)."""

    variant: Literal["fo", "hf"] = "fo"  # fo: first order; hf: Hessian-free
    alpha: float = 0.01  # inner step: w' = w - alpha grad f(w; D)
    beta: float | None = None  # outer step; null: the run's lr (decayed by lr_decay like it)
    steps: int = 10  # tau: meta-steps per round, each on fresh batches D, D' (and D'')
    hvp: Literal["exact", "finite_difference"] = "exact"  # hf: H(w; D'') v
    delta: float = 1e-3  # finite_difference: (g(w + delta v) - g(w - delta v)) / (2 delta)


@dataclass(frozen=True)
class PersonalEvalConfig:
    """Personalised evaluation (personal.py): every evaluation round each client
    takes ``steps`` SGD steps from the global model on its own training data, in
    minibatches of the run's ``batch_size``, then is scored on its held-out slice."""

    steps: int = 0  # 0: off
    lr: float | None = None  # null: perfedavg.alpha under perfedavg, else the run's lr


def validate_personal(cfg: Config) -> None:
    """Check the Per-FedAvg and personalised-evaluation fields (and how they combine)."""
    pfa, pev = cfg.perfedavg, cfg.personal_eval
    checks: list[tuple[str, Any, bool, str]] = [
        ("perfedavg.alpha", pfa.alpha, pfa.alpha >= 0.0, "must be a number >= 0"),
        (
            "perfedavg.beta",
            pfa.beta,
            pfa.beta is None or pfa.beta > 0.0,
            "must be a number > 0, or null (the run's lr)",
        ),
        ("perfedavg.steps", pfa.steps, pfa.steps >= 1, "must be an integer >= 1 (tau)"),
        ("perfedavg.delta", pfa.delta, pfa.delta > 0.0, "must be a number > 0"),
        (
            "personal_eval.steps",
            pev.steps,
            pev.steps >= 0,
            "must be an integer >= 0 (0 turns personalised evaluation off)",
        ),
        (
            "personal_eval.lr",
            pev.lr,
            pev.lr is None or pev.lr > 0.0,
            "must be a number > 0, or null (perfedavg.alpha under perfedavg, else lr)",
        ),
        (
            "personal_eval.steps",
            pev.steps,
            pev.steps == 0 or cfg.eval_clients,
            "needs eval_clients: true (clients are scored on their held-out slices)",
        ),
    ]
    if cfg.algorithm == "perfedavg":
        loc = cfg.local
        why = "must be {} with algorithm 'perfedavg' (its local loop is plain SGD steps)"
        checks += [
            ("local.momentum", loc.momentum, loc.momentum == 0.0, why.format(0)),
            ("local.weight_decay", loc.weight_decay, loc.weight_decay == 0.0, why.format(0)),
            ("local.grad_clip", loc.grad_clip, loc.grad_clip is None, why.format("null")),
            (
                "personal_eval.lr",
                pev.lr,
                pev.lr is not None or pev.steps == 0 or pfa.alpha > 0.0,
                "must be a number > 0 when perfedavg.alpha = 0 (null takes alpha: "
                "personalisation steps of size 0 would change nothing)",
            ),
            (
                "stragglers.fraction",
                cfg.stragglers.fraction,
                cfg.stragglers.fraction == 0.0,
                "must be 0 with algorithm 'perfedavg' (stragglers do fewer epochs; "
                "Per-FedAvg counts meta-steps, perfedavg.steps)",
            ),
            (
                "model",
                cfg.model,
                cfg.model != "cnn_bn",
                "must be a model without batch norm with algorithm 'perfedavg' (its three "
                "forward passes a step would move the running statistics three times)",
            ),
            (
                "precision",
                cfg.precision,
                cfg.precision == "fp32",
                "must be 'fp32' with algorithm 'perfedavg' (Hessian-vector products in bf16 "
                "are not supported)",
            ),
        ]
    for name, value, ok, allowed in checks:
        if not ok:
            raise invalid(name, value, allowed)


def step_sizes(cfg: Config) -> str:
    """The local step sizes a run uses, as the CLI and ``fedforge show`` print them:
    ``lr=...``, or Per-FedAvg's inner and outer steps and its meta-steps."""
    if cfg.algorithm != "perfedavg":
        return f"lr={cfg.lr}"
    pfa = cfg.perfedavg
    beta = cfg.lr if pfa.beta is None else pfa.beta
    return f"alpha={pfa.alpha} beta={beta} steps={pfa.steps}"

"""Whether a run's config sections can run together: every check that involves
two or more sections (the run's own top-level fields count as one), each a
small function taking the sections it reads and raising ConfigError with what
to change. ``Config`` runs them all from :func:`fedforge.config.schema.check`,
after each section has checked its own fields; what needs built objects (the
data, the model, the aggregator, the pipeline) is checked where those are built.
"""

from __future__ import annotations

import math

from fedforge.config.communication import CommunicationConfig
from fedforge.config.data import PartitionConfig
from fedforge.config.evaluation import EvaluationConfig, PersonalEvalConfig
from fedforge.config.local import (
    PROXIMAL_RANGE,
    WEIGHT_DECAY_RANGE,
    FedProxConfig,
    LocalConfig,
    PerFedAvgConfig,
    StragglerConfig,
    step_limit,
)
from fedforge.config.privacy import PrivacyConfig, delta_of
from fedforge.config.robust import RobustConfig
from fedforge.core.errors import ConfigError, invalid_field, raise_first

# the aggregation.weights computed from what each client reports (client/reports.py)
REPORTED_WEIGHTS = ("quality", "class")


def cohort_size(num_clients: int, client_fraction: float) -> int:
    """max(1, floor(C * N)), with a tolerance so that 0.1 * 100 is 10, not 9."""
    return max(1, min(num_clients, math.floor(client_fraction * num_clients + 1e-9)))


def describe_cohort(num_clients: int, client_fraction: float) -> str:
    """The cohort size in words, as refusals that depend on it say it."""
    k = cohort_size(num_clients, client_fraction)
    return f"the cohort of C N = {client_fraction} x {num_clients} is {k} clients"


# ------------------------------------------------------------ local training
def steps_fit_dtype(local: LocalConfig, lr: float, dtype: str) -> None:
    """A float32 run steps by lr * weight_decay: past float32's largest value the
    first round failed converting it."""
    if local.weight_decay * max(lr, 1.0) >= step_limit(dtype):
        raise invalid_field("local.weight_decay", local.weight_decay, WEIGHT_DECAY_RANGE)


def proximal_step_fits_dtype(fedprox: FedProxConfig, lr: float, dtype: str) -> None:
    """A float32 run steps by lr * mu (FedProx): past float32's largest value the
    first round failed converting it."""
    if fedprox.mu * max(lr, 1.0) >= step_limit(dtype):
        raise invalid_field("fedprox.mu", fedprox.mu, PROXIMAL_RANGE)


def stragglers_need_epochs(stragglers: StragglerConfig, local_epochs: int) -> None:
    if stragglers.fraction != 0.0 and local_epochs < 2:
        raise invalid_field(
            "stragglers.fraction",
            stragglers.fraction,
            f"needs local_epochs >= 2 (stragglers do 1..E-1 epochs; E = {local_epochs})",
        )


def perfedavg_plain_sgd(algorithm: str, local: LocalConfig) -> None:
    """Per-FedAvg's local loop is plain SGD steps: no local optimizer knob."""
    if algorithm != "perfedavg":
        return
    why = "must be {} with algorithm 'perfedavg' (its local loop is plain SGD steps)"
    raise_first(
        "local.",
        [
            ("momentum", local.momentum, local.momentum == 0.0, why.format(0)),
            ("weight_decay", local.weight_decay, local.weight_decay == 0.0, why.format(0)),
            ("grad_clip", local.grad_clip, local.grad_clip is None, why.format("null")),
        ],
    )


def perfedavg_personal_lr(
    algorithm: str, perfedavg: PerFedAvgConfig, personal_eval: PersonalEvalConfig
) -> None:
    """Under Per-FedAvg the personalisation steps default to its alpha."""
    pev = personal_eval
    if algorithm == "perfedavg" and pev.lr is None and pev.steps != 0 and perfedavg.alpha <= 0.0:
        raise invalid_field(
            "evaluation.personal.lr",
            pev.lr,
            "must be a number > 0 when perfedavg.alpha = 0 (null takes alpha: "
            "personalisation steps of size 0 would change nothing)",
        )


def perfedavg_no_stragglers(algorithm: str, stragglers: StragglerConfig) -> None:
    if algorithm == "perfedavg" and stragglers.fraction != 0.0:
        raise invalid_field(
            "stragglers.fraction",
            stragglers.fraction,
            "must be 0 with algorithm 'perfedavg' (stragglers do fewer epochs; "
            "Per-FedAvg counts meta-steps, perfedavg.steps)",
        )


def perfedavg_model(algorithm: str, model: str, precision: str) -> None:
    if algorithm != "perfedavg":
        return
    raise_first(
        "",
        [
            (
                "model",
                model,
                model != "cnn_bn",
                "must be a model without batch norm with algorithm 'perfedavg' (its three "
                "forward passes a step would move the running statistics three times)",
            ),
            (
                "precision",
                precision,
                precision == "fp32",
                "must be 'fp32' with algorithm 'perfedavg' (Hessian-vector products in bf16 "
                "are not supported)",
            ),
        ],
    )


# ------------------------------------------------------------ data, evaluation
def feature_shift_needs_images(partition: PartitionConfig, dataset: str) -> None:
    shift = partition.feature_shift
    if shift and dataset != "mnist":
        raise invalid_field(
            "partition.feature_shift",
            list(shift),
            "needs dataset 'mnist' (the domains transform 28x28 images); use [] with "
            f"dataset {dataset!r}",
        )


def feature_shift_needs_standard_scaling(partition: PartitionConfig, input_scaling: str) -> None:
    """The domains (data/shift.py) map standardised images to pixels and back."""
    shift = partition.feature_shift
    if shift and input_scaling != "standard":
        raise invalid_field(
            "partition.feature_shift",
            list(shift),
            "needs input_scaling 'standard' (the domains transform standardised images); "
            f"use [] with input_scaling {input_scaling!r}",
        )


def personal_eval_needs_client_eval(evaluation: EvaluationConfig) -> None:
    if evaluation.personal.steps != 0 and not evaluation.clients:
        raise invalid_field(
            "evaluation.personal.steps",
            evaluation.personal.steps,
            "needs evaluation.clients: true (clients are scored on their held-out slices)",
        )


def client_tags_need_client_eval(evaluation: EvaluationConfig) -> None:
    if evaluation.client_tags is not None and not evaluation.clients:
        raise invalid_field(
            "evaluation.client_tags",
            evaluation.client_tags,
            "needs evaluation.clients: true (a group's accuracy is its clients' held-out slices')",
        )


def declared_sizes_need_a_cap(
    client_data: str, max_weight_ratio: float | None, weights: str
) -> None:
    """Clients that bring their own data declare their example counts themselves:
    uncapped, one client's claim could be the whole weighted mean."""
    if client_data == "remote" and weights == "num_examples" and not max_weight_ratio:
        raise invalid_field(
            "robust.max_weight_ratio",
            max_weight_ratio,
            "must be set (e.g. 10) with deployment.client_data: remote: the clients declare "
            "their own example counts, and a claim is capped at that multiple of the median",
        )


# ------------------------------------------------------------ communication
def groups_within_clients(communication: CommunicationConfig, num_clients: int) -> None:
    groups = communication.groups
    if not 0 <= groups <= num_clients:
        raise invalid_field(
            "communication.groups", groups, f"must be 0 (off) or 1..num_clients ({num_clients})"
        )


def groups_need_example_weights(communication: CommunicationConfig, weights: str) -> None:
    """Each edge averages its clients by examples."""
    groups = communication.groups
    if groups and weights != "num_examples":
        raise ConfigError(
            f"communication.groups = {groups} needs aggregation.weights = 'num_examples' "
            f"(each edge averages its clients by examples; '{weights}' "
            "would be applied to the edges, not the clients)"
        )


# ------------------------------------------------------------ robustness
def attack_needs_floats(robust: RobustConfig, privacy: PrivacyConfig) -> None:
    if robust.attack == "uint8" and privacy.secagg:
        raise ConfigError(
            "robust.attack 'uint8' (float tensors sent as raw bytes) cannot be simulated "
            "with privacy.secagg: a masked update is integer words, so the attack would "
            "change nothing; use 'nan_inf' or 'scaled' there"
        )


def robust_fits_cohort(robust: RobustConfig, num_clients: int, client_fraction: float) -> None:
    """What the cohort size K = max(1, floor(C N)) must allow (the aggregators' own
    n >= 2f + 3 or 4f + 3 is checked on the built aggregator: robust/parts.py)."""
    r, k = robust, cohort_size(num_clients, client_fraction)
    cohort = describe_cohort(num_clients, client_fraction)
    m = r.multi_krum_m
    if r.aggregator == "multi_krum" and m is not None and m > k - r.byzantine:
        raise ConfigError(f"robust.multi_krum_m = {m} exceeds n - f = {k - r.byzantine}: {cohort}")
    if r.min_clients is not None and r.min_clients > k:
        raise ConfigError(
            f"robust.min_clients = {r.min_clients} can never be met: {cohort}; every round "
            "would be skipped"
        )


# ------------------------------------------------------------ privacy
def delta_below_one_over_n(privacy: PrivacyConfig, num_clients: int) -> None:
    p = privacy
    if (p.dp != "none" or p.tiers.enabled) and delta_of(p, num_clients) >= 1 / num_clients:
        raise invalid_field(
            "privacy.delta",
            p.delta,
            f"must be below 1 / num_clients = {1 / num_clients:.3g} (a delta of 1/N "
            "allows publishing one client's data outright), or null (1 / num_clients**1.1)",
        )


def secagg_can_hide(privacy: PrivacyConfig, communication: CommunicationConfig) -> None:
    """What secure aggregation cannot hide, or cannot size its modulus for."""
    p, comm = privacy, communication
    if not p.secagg:
        return
    refusals = [
        (
            p.adaptive_clip,
            "privacy.adaptive_clip sends each client's unclipped bit in the clear beside "
            "its masked update; set adaptive_clip to false",
        ),
        (
            comm.uplink != "dense" or comm.error_feedback,
            f"communication.uplink = '{comm.uplink}' (error_feedback = {comm.error_feedback}) "
            "is a codec of its own; the masked update is the uplink: use uplink = dense "
            "without error feedback",
        ),
        (
            comm.groups > 0,
            f"communication.groups = {comm.groups}: an edge would average individual "
            "updates it cannot see; set groups to 0",
        ),
        (
            p.dp == "none" and not p.tiers.enabled and comm.clip_norm is None,
            "the modulus is sized from a bound on each update: set privacy.dp (its "
            "clip_norm) or communication.clip_norm",
        ),
    ]
    for bad, why in refusals:
        if bad:
            raise ConfigError(f"privacy.secagg: {why}")


def secagg_neighbours_fit_cohort(
    privacy: PrivacyConfig, num_clients: int, client_fraction: float
) -> None:
    m = cohort_size(num_clients, client_fraction)
    k = privacy.secagg_neighbours
    if privacy.secagg and k is not None and k >= m:
        raise invalid_field(
            "privacy.secagg_neighbours",
            k,
            f"must be below the cohort of {m} clients (2 <= k < {m}, even); null masks every pair",
        )


def one_clip(privacy: PrivacyConfig, communication: CommunicationConfig) -> None:
    p, clip = privacy, communication.clip_norm
    if (p.dp != "none" or p.tiers.enabled) and clip is not None:
        what = "privacy.tiers" if p.tiers.enabled else f"privacy.dp = '{p.dp}'"
        raise ConfigError(
            f"communication.clip_norm = {clip} and {what} both clip; "
            "DP clips with privacy.clip_norm: set communication.clip_norm to null"
        )


def dp_noise_needs_mean(privacy: PrivacyConfig, robust: RobustConfig) -> None:
    """Central and distributed DP noise is calibrated to a sum (tiers and local DP
    noise each client's update instead)."""
    p = privacy
    if p.tiers.enabled or p.dp not in ("central", "distributed"):
        return
    if robust.aggregator != "mean":
        raise ConfigError(
            f"privacy.dp = '{p.dp}' adds noise calibrated to a sum, but robust.aggregator = "
            f"'{robust.aggregator}' is not one: use robust.aggregator = mean"
        )


def client_gate_outside_dp(robust: RobustConfig, privacy: PrivacyConfig) -> None:
    """Whether a client withholds its update is a decision on its un-noised
    held-out loss, a release the accountant does not count. (Under secure
    aggregation alone the withheld note carries no numbers.)"""
    p = privacy
    if robust.client_gate and (p.dp in ("local", "distributed") or p.tiers.enabled):
        what = "privacy.tiers" if p.tiers.enabled else f"privacy.dp = '{p.dp}'"
        raise ConfigError(
            f"robust.client_gate with {what}: withholding an update is a decision on the "
            "client's un-noised held-out loss, outside the privacy accounting; "
            "set robust.client_gate = false"
        )


def weights_need_plain_mean(weights: str, privacy: PrivacyConfig, robust: RobustConfig) -> None:
    """A rule other than num_examples maps the plain weighted mean's weights; DP
    and secure aggregation weigh clients themselves."""
    rule, p = weights, privacy
    if rule == "num_examples":
        return
    if p.dp in ("central", "distributed") or (p.secagg and robust.aggregator == "mean"):
        raise ConfigError(
            f"aggregation.weights = {rule!r} needs the plain weighted mean; DP and secure "
            "aggregation weigh clients by privacy.weights (uniform or capped)"
        )
    if robust.aggregator != "mean":
        raise ConfigError(
            f"aggregation.weights = {rule!r} needs robust.aggregator = 'mean' (the plain "
            f"weighted mean); {robust.aggregator!r} weighs updates its own way"
        )
    if rule in REPORTED_WEIGHTS and p.hides_updates:
        sent = "validation loss" if rule == "quality" else "label counts"
        raise ConfigError(
            f"aggregation.weights = {rule!r} sends each client's exact {sent} outside "
            "the privacy mechanism (local DP, tiers); use num_examples, uniform, sqrt or capped"
        )


def central_dp_needs_dense_uplink(
    privacy: PrivacyConfig, communication: CommunicationConfig
) -> None:
    uplink = communication.uplink
    if privacy.dp == "central" and uplink != "dense":
        raise ConfigError(
            f"communication.uplink = '{uplink}' cannot be combined with privacy.dp = 'central': "
            "the codec runs after the clip, and what the server sums may then exceed the clip "
            "norm the noise is calibrated to (int2 measured 1.8x); use 'dense', or dp = 'local' "
            "(noise before the codec)"
        )


def groups_exclude_central_dp(communication: CommunicationConfig, privacy: PrivacyConfig) -> None:
    groups = communication.groups
    if groups and privacy.dp == "central":
        raise ConfigError(
            f"communication.groups = {groups} cannot be combined with privacy.dp = 'central' "
            "(its mean counts each client's clipped update; the edges would send their "
            "means, each counted as one client)"
        )


def over_selection_without_dp(over_selection: float, privacy: PrivacyConfig) -> None:
    """Over-selection closes a round at its first K answers: the cohort is no longer
    the random sample of rate C that the DP accountant's amplification assumes
    (privacy tiers count on it too), and secure aggregation's threshold t is drawn
    from the larger cohort asked, so K answers could fall short of it."""
    if over_selection <= 0:
        return
    said = f"deployment.over_selection = {over_selection:g}"
    if privacy.dp != "none" or privacy.tiers.enabled:
        what = f"privacy.dp = '{privacy.dp}'" if privacy.dp != "none" else "privacy tiers"
        raise ConfigError(
            f"{said} with {what}: the round would close at its fastest clients, not a "
            "random sample of rate client_fraction, and the accountant's epsilon would not "
            "hold; set over_selection to 0"
        )
    if privacy.secagg:
        raise ConfigError(
            f"{said} with privacy.secagg: the threshold is drawn from the clients asked, "
            "and the round closes at fewer; set over_selection to 0 (secure aggregation "
            "recovers from dropouts by itself)"
        )

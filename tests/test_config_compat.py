"""config/compat.py: every check across sections refuses its bad combination
when the config is read (no data, no build), with its message; the other test
files cover the same refusals through a build and the runs they allow."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

from fedforge.config import compat, from_dict
from fedforge.core.errors import ConfigError

DP = {"dp": "central", "clip_norm": 1.0, "noise_multiplier": 1.0}
LOCAL_DP = {**DP, "dp": "local"}
SECAGG = {"secagg": True}

# check -> (a config that breaks only it, the start of its message)
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "steps_fit_dtype": (
        {"lr": 2.0, "local": {"weight_decay": 3e38}},
        "config field 'local.weight_decay' = 3e+38 is invalid: must be >= 0 (lr * weight_decay",
    ),
    "proximal_step_fits_dtype": (  # float32 steps by lr * mu
        {"lr": 2.0, "fedprox": {"mu": 3e38}},
        "config field 'fedprox.mu' = 3e+38 is invalid: must be >= 0 (FedProx's proximal "
        "coefficient; lr * mu below 3.4e38 in a float32 run)",
    ),
    "stragglers_need_epochs": (
        {"stragglers": {"fraction": 0.5}},
        "config field 'stragglers.fraction' = 0.5 is invalid: needs local_epochs >= 2",
    ),
    "perfedavg_plain_sgd": (
        {"algorithm": "perfedavg", "local": {"momentum": 0.9}},
        "config field 'local.momentum' = 0.9 is invalid: must be 0 with algorithm 'perfedavg'",
    ),
    "perfedavg_personal_lr": (
        {
            "algorithm": "perfedavg",
            "perfedavg": {"alpha": 0.0},
            "evaluation": {"clients": True, "personal": {"steps": 2}},
        },
        "config field 'evaluation.personal.lr' = None is invalid: must be a number > 0 when "
        "perfedavg.alpha = 0",
    ),
    "perfedavg_no_stragglers": (
        {"algorithm": "perfedavg", "stragglers": {"fraction": 0.5}},
        "config field 'stragglers.fraction' = 0.5 is invalid: must be 0 with algorithm 'perfedavg'",
    ),
    "perfedavg_model": (
        {"algorithm": "perfedavg", "model": "cnn_bn"},
        "config field 'model' = 'cnn_bn' is invalid: must be a model without batch norm",
    ),
    "feature_shift_needs_images": (
        {"dataset": "synthetic", "model": "logreg", "partition": {"feature_shift": ["blur"]}},
        "config field 'partition.feature_shift' = ['blur'] is invalid: needs dataset 'mnist'",
    ),
    "feature_shift_needs_standard_scaling": (
        {"input_scaling": "unit", "partition": {"feature_shift": ["blur"]}},
        "config field 'partition.feature_shift' = ['blur'] is invalid: needs input_scaling "
        "'standard'",
    ),
    "personal_eval_needs_client_eval": (
        {"evaluation": {"personal": {"steps": 1}}},
        "config field 'evaluation.personal.steps' = 1 is invalid: needs evaluation.clients: true",
    ),
    "groups_within_clients": (
        {"num_clients": 4, "communication": {"groups": 5}},
        "config field 'communication.groups' = 5 is invalid: must be 0 (off) or 1..num_clients (4)",
    ),
    "groups_need_example_weights": (
        {"communication": {"groups": 2}, "aggregation": {"weights": "uniform"}},
        "communication.groups = 2 needs aggregation.weights = 'num_examples'",
    ),
    "attack_needs_floats": (
        {"robust": {"attack": "uint8", "attack_fraction": 0.1}, "privacy": SECAGG},
        "robust.attack 'uint8' (float tensors sent as raw bytes) cannot be simulated",
    ),
    "robust_fits_cohort": (
        {"num_clients": 10, "robust": {"min_clients": 2}},
        "robust.min_clients = 2 can never be met: the cohort of C N = 0.1 x 10 is 1 clients",
    ),
    "delta_below_one_over_n": (
        {"num_clients": 10, "privacy": {**DP, "delta": 0.2}},
        "config field 'privacy.delta' = 0.2 is invalid: must be below 1 / num_clients = 0.1",
    ),
    "secagg_can_hide": (
        {"privacy": SECAGG, "communication": {"clip_norm": 1.0, "groups": 2}},
        "privacy.secagg: communication.groups = 2: an edge would average individual updates",
    ),
    "secagg_neighbours_fit_cohort": (
        {"privacy": {**DP, **SECAGG, "secagg_neighbours": 10}},
        "config field 'privacy.secagg_neighbours' = 10 is invalid: must be below the cohort "
        "of 10 clients",
    ),
    "one_clip": (
        {"privacy": LOCAL_DP, "communication": {"clip_norm": 1.0}},
        "communication.clip_norm = 1.0 and privacy.dp = 'local' both clip",
    ),
    "dp_noise_needs_mean": (
        {"privacy": DP, "robust": {"aggregator": "median"}},
        "privacy.dp = 'central' adds noise calibrated to a sum, but robust.aggregator = 'median'",
    ),
    "client_gate_outside_dp": (
        {"privacy": LOCAL_DP, "robust": {"client_gate": True}},
        "robust.client_gate with privacy.dp = 'local': withholding an update",
    ),
    "weights_need_plain_mean": (
        {"aggregation": {"weights": "class"}, "privacy": LOCAL_DP},
        "aggregation.weights = 'class' sends each client's exact label counts",
    ),
    "central_dp_needs_dense_uplink": (
        {"privacy": DP, "communication": {"uplink": "int8"}},
        "communication.uplink = 'int8' cannot be combined with privacy.dp = 'central'",
    ),
    "groups_exclude_central_dp": (
        {"privacy": DP, "communication": {"groups": 2}},
        "communication.groups = 2 cannot be combined with privacy.dp = 'central'",
    ),
    "client_tags_need_client_eval": (
        {"evaluation": {"client_tags": "tags.csv"}},
        "config field 'evaluation.client_tags' = 'tags.csv' is invalid: needs evaluation.clients: "
        "true",
    ),
    "declared_sizes_need_a_cap": (
        {"dataset": "synthetic", "model": "logreg", "deployment": {"client_data": "remote"}},
        "config field 'robust.max_weight_ratio' = None is invalid: must be set (e.g. 10) "
        "with deployment.client_data: remote",
    ),
    "over_selection_without_dp": (
        {"privacy": LOCAL_DP, "deployment": {"over_selection": 0.3}},
        "deployment.over_selection = 0.3 with privacy.dp = 'local': the round would close",
    ),
}


def test_every_check_has_a_case() -> None:
    checks = {
        name
        for name, fn in inspect.getmembers(compat, inspect.isfunction)
        if fn.__module__ == compat.__name__ and name not in ("cohort_size", "describe_cohort")
    }
    assert checks == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_when_the_config_is_read(name: str) -> None:
    data, message = CASES[name]
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        from_dict(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [  # the other branches of the checks with several refusals
        (
            {"algorithm": "perfedavg", "precision": "bf16"},
            "config field 'precision' = 'bf16' is invalid: must be 'fp32' with algorithm",
        ),
        (
            {"num_clients": 10, "client_fraction": 0.5, "robust": {"aggregator": "multi_krum"}},
            "",  # allowed: m = null is n - f
        ),
        (
            {"robust": {"aggregator": "multi_krum", "byzantine": 1, "multi_krum_m": 10}},
            "robust.multi_krum_m = 10 exceeds n - f = 9: the cohort of C N = 0.1 x 100 is 10",
        ),
        (
            {"privacy": {**SECAGG, "adaptive_clip": True, "dp": "central"}},
            "privacy.secagg: privacy.adaptive_clip sends each client's unclipped bit",
        ),
        (
            {"privacy": {**DP, **SECAGG}, "communication": {"uplink": "int8"}},
            "privacy.secagg: communication.uplink = 'int8' (error_feedback = False)",
        ),
        ({"privacy": SECAGG}, "privacy.secagg: the modulus is sized from a bound"),
        (
            {"aggregation": {"weights": "sqrt"}, "privacy": DP},
            "aggregation.weights = 'sqrt' needs the plain weighted mean",
        ),
        (
            {"aggregation": {"weights": "sqrt"}, "robust": {"aggregator": "median"}},
            "aggregation.weights = 'sqrt' needs robust.aggregator = 'mean'",
        ),
    ],
)
def test_other_refusals(data: dict[str, Any], message: str) -> None:
    if not message:
        from_dict(data)
        return
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        from_dict(data)


def test_cohort_size() -> None:
    assert compat.cohort_size(100, 0.1) == 10  # not 9: 0.1 * 100 is 10.000000000000002
    assert compat.cohort_size(10, 0.01) == 1
    assert compat.cohort_size(7, 1.0) == 7

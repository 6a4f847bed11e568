"""fedforge's own components, registered through the public ``register`` as a
plugin registers its own. Each factory is named by ``"module:attribute"`` text,
imported when a run is built with it: registering imports nothing, so a
config's names are checked without loading torch or any component's module.

Each factory takes one ``ComponentContext`` (config/components.py): the run's
config, the component's name and options, and for the kinds that need them
the parameter spec and dtype."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ALGORITHMS = {
    "fedavg": "fedforge.algorithms.factories:fedavg_factory",
    "fedsgd": "fedforge.algorithms.factories:fedsgd_factory",
    "fedprox": "fedforge.algorithms.factories:fedprox_factory",
    "scaffold": "fedforge.algorithms.factories:scaffold_factory",
    "fedbn": "fedforge.algorithms.factories:fedbn_factory",
    "perfedavg": "fedforge.algorithms.factories:perfedavg_factory",
}
_ROBUST = "fedforge.robust.factories"
AGGREGATORS = {
    "mean": f"{_ROBUST}:mean",
    "median": f"{_ROBUST}:median",
    "trimmed_mean": f"{_ROBUST}:trimmed_mean",
    "krum": f"{_ROBUST}:krum",
    "multi_krum": f"{_ROBUST}:multi_krum",
    "bulyan": f"{_ROBUST}:bulyan",
    "geometric_median": f"{_ROBUST}:geometric_median",
    "norm_bound": f"{_ROBUST}:norm_bound",
    "centred_clip": f"{_ROBUST}:centred_clip",
}
SERVER_OPTIMIZERS = {
    "sgd": "fedforge.server.optimizers:sgd_factory",
    "adagrad": "fedforge.server.optimizers:adaptive_factory",
    "adam": "fedforge.server.optimizers:adaptive_factory",
    "yogi": "fedforge.server.optimizers:adaptive_factory",
}
_CODECS = "fedforge.communication.codecs"
CODECS = {
    "dense": f"{_CODECS}:dense",
    "float16": f"{_CODECS}:cast",
    "bfloat16": f"{_CODECS}:cast",
    "int8": f"{_CODECS}:quantize",
    "int4": f"{_CODECS}:quantize",
    "int2": f"{_CODECS}:quantize",
    "sign": f"{_CODECS}:quantize",
    "topk": f"{_CODECS}:topk",
    "randk": f"{_CODECS}:randk",
}
_SELECTION = "fedforge.selection"
SELECTIONS = {
    "uniform": f"{_SELECTION}.sampling:uniform_factory",
    "power_of_choice": f"{_SELECTION}.power_of_choice:factory",
    "oort": f"{_SELECTION}.oort:factory",
    "fairness_floor": f"{_SELECTION}.fairness_floor:factory",
    "deadline_aware": f"{_SELECTION}.deadline:factory",
}
# the options dataclasses of the built-ins that take options, by (kind, name)
OPTIONS = {
    ("selection", "power_of_choice"): f"{_SELECTION}.options:PowerOfChoiceOptions",
    ("selection", "oort"): f"{_SELECTION}.options:OortOptions",
    ("selection", "fairness_floor"): f"{_SELECTION}.options:FairnessFloorOptions",
    ("selection", "deadline_aware"): f"{_SELECTION}.options:DeadlineOptions",
}
_METRICS = "fedforge.tasks.named_metrics"
METRICS = {
    "accuracy": f"{_METRICS}:accuracy",
    "token_accuracy": f"{_METRICS}:token_accuracy",
    "mse": f"{_METRICS}:mse",
}


def register_builtins(register: Callable[..., Any]) -> None:
    """Register every built-in with ``register`` (core/registry.py's)."""
    for kind, table in (
        ("algorithm", ALGORITHMS),
        ("aggregator", AGGREGATORS),
        ("server_optimizer", SERVER_OPTIMIZERS),
        ("codec", CODECS),
        ("selection", SELECTIONS),
        ("metric", METRICS),
    ):
        for name, factory in table.items():
            register(kind, name, factory, options=OPTIONS.get((kind, name)))

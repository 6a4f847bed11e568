"""fedforge's own components, registered through the public ``register`` as a
plugin registers its own. Each factory is named by ``"module:attribute"`` text,
imported when a run is built with it: registering imports nothing, so a
config's names are checked without loading torch or any component's module.

Each factory takes what its kind's factories take (each kind's ``register_*``
helper says): one ``ComponentContext`` (config/components.py: the run's config,
the component's name and options, and for the kinds that need them the
parameter spec and dtype); a model's factory a ``ModelContext``
(models/factory.py: its name and the data's ``DataSpec``)."""

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
    "cfl": "fedforge.algorithms.clustered:cfl_factory",
    "ifca": "fedforge.algorithms.clustered:ifca_factory",
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
    "grouped_rotation": f"{_SELECTION}.grouped:factory",
}
_LR = "fedforge.server.lr_rules"
LR_RULES = {
    "data_size": f"{_LR}:data_size",
    "reported_loss": f"{_LR}:reported_loss",
    "lr_csv": f"{_LR}:lr_csv",
}
# the options dataclasses of the built-ins that take options, by (kind, name)
OPTIONS = {
    ("lr_rule", "data_size"): "fedforge.config.client_lr:DataSizeOptions",
    ("lr_rule", "reported_loss"): "fedforge.config.client_lr:ReportedLossOptions",
    ("lr_rule", "lr_csv"): "fedforge.config.client_lr:LrCsvOptions",
    ("algorithm", "cfl"): "fedforge.config.clusters:CflOptions",
    ("algorithm", "ifca"): "fedforge.config.clusters:IfcaOptions",
    ("selection", "power_of_choice"): f"{_SELECTION}.options:PowerOfChoiceOptions",
    ("selection", "oort"): f"{_SELECTION}.options:OortOptions",
    ("selection", "fairness_floor"): f"{_SELECTION}.options:FairnessFloorOptions",
    ("selection", "deadline_aware"): f"{_SELECTION}.options:DeadlineOptions",
    ("selection", "grouped_rotation"): f"{_SELECTION}.options:GroupedRotationOptions",
}
_METRICS = "fedforge.tasks.named_metrics"
METRICS = {
    "accuracy": f"{_METRICS}:accuracy",
    "token_accuracy": f"{_METRICS}:token_accuracy",
    "mse": f"{_METRICS}:mse",
}
# the built-in stages a section places (each built by its name when its field is
# set), by that field; a config's pipeline lists do not name them
STAGES = {
    "clip": "fedforge.pipeline.clip:clip_stage",
    "norm_gate": "fedforge.robust.gates:norm_gate_stage",
}
PLACED_BY = {"clip": "communication.clip_norm", "norm_gate": "robust.norm_gate"}
_MODELS = "fedforge.models.builtin"
MODELS = {
    "2nn": f"{_MODELS}:mlp",
    "cnn": f"{_MODELS}:cnn",
    "cnn_bn": f"{_MODELS}:cnn_bn",
    "logreg": f"{_MODELS}:logreg",
    "char_lstm": f"{_MODELS}:char_lstm",
    "linear": f"{_MODELS}:linear",
}
# each built-in task: the data set and model it trains (a config naming the task
# reads as naming that pair: config/task.py)
TASK_DATA: dict[str, tuple[str, str]] = {
    "mnist-2nn": ("mnist", "2nn"),
    "mnist-cnn": ("mnist", "cnn"),
    "synthetic-logreg": ("synthetic", "logreg"),
    "shakespeare-lstm": ("shakespeare", "char_lstm"),
    "linear-regression": ("regression", "linear"),
}
TASKS = {name: "fedforge.tasks.task:data_set_task" for name in TASK_DATA}

TABLES: dict[str, dict[str, str]] = {
    "algorithm": ALGORITHMS,
    "aggregator": AGGREGATORS,
    "server_optimizer": SERVER_OPTIMIZERS,
    "codec": CODECS,
    "selection": SELECTIONS,
    "lr_rule": LR_RULES,
    "metric": METRICS,
    "stage": STAGES,
    "model": MODELS,
    "task": TASKS,
}


def register_builtins(register: Callable[..., Any]) -> None:
    """Register every built-in with ``register`` (core/registry.py's)."""
    for kind, table in TABLES.items():
        for name, factory in table.items():
            register(kind, name, factory, options=OPTIONS.get((kind, name)))


def is_builtin(kind: str, name: str, factory: object) -> bool:
    """Whether ``factory`` is fedforge's own ``kind`` called ``name`` (not a
    plugin's that replaced it)."""
    return TABLES.get(kind, {}).get(name) == factory

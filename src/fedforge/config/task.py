"""The config's ``task``: what is trained and how it is judged. A built-in task
names a data set and a model (``task: shakespeare-lstm`` is ``dataset:
shakespeare`` with ``model: char_lstm``: the pairs are core/builtins.py's
``TASK_DATA``); the older ``dataset``/``model`` pair stays a shorthand for the
task of that data set. Every named task, built in or registered by the caller
(fedforge.register_task), is found in the registry where the run is built.

Each data set's kind of labels decides the loss and the metrics (fedforge.tasks)
and what else the run may ask of its labels, checked here in one line each:
class-based partitions, class weights, label noise and label flipping need class
ids, one a row."""

from __future__ import annotations

from typing import Literal

from fedforge.config.data import PartitionConfig
from fedforge.config.robust import RobustConfig
from fedforge.core import registry
from fedforge.core.builtins import TASK_DATA
from fedforge.core.errors import ConfigError, invalid_field

Kind = Literal["classification", "sequence", "regression"]

# built-in task -> the (dataset, model) a config naming it trains
BUILT_IN_TASKS: dict[str, tuple[str, str]] = TASK_DATA
# each data set's labels: one class a row, one class a step of a sequence, or values
KINDS: dict[str, Kind] = {
    "mnist": "classification",
    "synthetic": "classification",
    "shakespeare": "sequence",
    "regression": "regression",
}
DEFAULT_DATA = ("mnist", "cnn")  # Config's own defaults of dataset and model
# the partitions that deal each class's rows, and those that need none
CLASS_PARTITIONS = ("shards", "dirichlet", "hsu")


def task_data(task: str | None, dataset: str, model: str) -> tuple[str, str]:
    """The (dataset, model) a config with ``task`` trains: the built-in task's pair,
    where the config's own fields are left at their defaults or agree with it."""
    if task is None or task not in BUILT_IN_TASKS:
        return dataset, model  # no task, or the caller's (fedforge.tasks resolves it)
    wanted = BUILT_IN_TASKS[task]
    for field, got, want, default in zip(
        ("dataset", "model"), (dataset, model), wanted, DEFAULT_DATA, strict=True
    ):
        if got not in (want, default):
            raise ConfigError(
                f"{field} = {got!r} disagrees with task = {task!r}, which trains model "
                f"{wanted[1]!r} on dataset {wanted[0]!r}: drop one of the two"
            )
    return wanted


def check_task_name(task: str | None) -> None:
    if task is not None and (not isinstance(task, str) or not task.strip()):
        raise invalid_field(
            "task",
            task,
            f"must be a task name: {', '.join(BUILT_IN_TASKS)}, or one given to "
            "fedforge.register_task",
        )


def labels_fit_features(
    dataset: str,
    partition: PartitionConfig,
    aggregation_weights: str,
    robust: RobustConfig,
    group_by: str = "none",
    kind: Kind | None = None,
) -> None:
    """What needs one class id a row refuses the data sets whose labels are not
    (``kind``: the labels' kind when known, e.g. of a task of the caller's)."""
    kind = kind or KINDS.get(dataset, "classification")
    if kind == "classification":
        return
    labels = "one class a character" if kind == "sequence" else "real-valued targets"
    why = f"the task's data has {labels}, not one class id a row"
    if partition.kind in CLASS_PARTITIONS:
        raise invalid_field(
            "partition.kind", partition.kind, f"deals classes over clients; {why} (use iid)"
        )
    if aggregation_weights == "class":
        raise invalid_field("aggregation.weights", "class", f"weighs clients by class; {why}")
    if partition.label_noise > 0:
        raise invalid_field(
            "partition.label_noise", partition.label_noise, f"flips class ids; {why}"
        )
    if partition.concept_shift > 0:
        raise invalid_field(
            "partition.concept_shift", partition.concept_shift, f"permutes class ids; {why}"
        )
    if robust.attack == "label_flip":
        raise invalid_field("robust.attack", "label_flip", f"flips class ids; {why}")
    if group_by == "label":
        raise invalid_field("communication.group_by", "label", f"groups clients by class; {why}")


def natural_needs_own_clients(partition: PartitionConfig, dataset: str) -> None:
    """``partition.kind: natural`` keeps the clients the data set comes with."""
    if partition.kind == "natural" and dataset not in ("shakespeare", "synthetic"):
        raise invalid_field(
            "partition.kind",
            "natural",
            f"keeps the clients a data set comes with (shakespeare: its speaking roles); "
            f"dataset {dataset!r} has none (use iid, shards, dirichlet, hsu or quantity)",
        )


# the built-in models each data set's rows and labels fit
FITTING_MODELS: dict[str, tuple[str, ...]] = {
    "mnist": ("2nn", "cnn", "cnn_bn", "logreg"),
    "synthetic": ("logreg",),
    "shakespeare": ("char_lstm",),
    "regression": ("linear",),
}
BUILT_IN_MODELS = frozenset(m for models in FITTING_MODELS.values() for m in models)


def model_fits_dataset(model: str, dataset: str, task: str | None = None) -> None:
    """A built-in model reads the rows and predicts the labels of some data sets
    only; a model of the caller's (one that replaced a built-in name too), or any
    model of a task of the caller's (its own data), is checked against the data
    where it is built."""
    if task is not None and task not in BUILT_IN_TASKS:
        return
    fitting = FITTING_MODELS.get(dataset, ())
    if model in BUILT_IN_MODELS and model not in fitting and registry.is_builtin("model", model):
        raise invalid_field(
            "model",
            model,
            f"does not fit dataset {dataset!r}; its built-in models: {', '.join(fitting)} "
            "(or one of your own: fedforge.register_model)",
        )

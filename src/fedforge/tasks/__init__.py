"""Tasks: what a run trains and how it is judged (idea 8 of the design). A config
names a built-in task (``task: shakespeare-lstm``) or the ``dataset``/``model``
shorthand; a caller registers its own (:func:`register_task`) or hands a
:class:`Task` to ``fedforge.run``."""

from __future__ import annotations

from fedforge.config import Config
from fedforge.config.task import BUILT_IN_TASKS
from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.data import federated
from fedforge.data.federated import FederatedData
from fedforge.models import check_model_name
from fedforge.tasks.losses import LossFn, cross_entropy, squared_error, token_cross_entropy
from fedforge.tasks.metrics import Metrics, Scores
from fedforge.tasks.task import Task, config_task

TASKS = registry.view("task")  # the caller's, by name (register_task), in the registry


def register_task(task: Task) -> None:
    """Make ``task: <task.name>`` in a config run ``task``; registering a name again
    replaces it. Register before the run, and before its resume."""
    if not isinstance(task, Task):
        raise ConfigError(f"register_task takes a fedforge.Task, got {type(task).__name__}")
    if not task.name.strip() or task.name in BUILT_IN_TASKS:
        raise ConfigError(
            f"task name {task.name!r} cannot be registered: a non-empty name other than the "
            f"built-in {', '.join(BUILT_IN_TASKS)}"
        )
    TASKS[task.name] = GivenTask(task)


def load_task_data(cfg: Config, task: Task | None = None) -> FederatedData:
    """The data of the run's task: its own loader's, else the config's data set
    (``federated.load_federated_data``, looked up when called: one place to stand in)."""
    task = resolve_task(cfg, task)
    return task.data_fn(cfg) if task.data_fn else federated.load_federated_data(cfg)


def load_server_data(cfg: Config, task: Task | None = None) -> FederatedData:
    """What a deployment server holds whose clients bring their own data
    (``deployment.client_data: remote``): the task's test set, and no client's rows."""
    task = resolve_task(cfg, task)
    if task.data_fn is not None:
        return federated.test_set_only(task.data_fn(cfg), cfg.num_clients)
    return federated.load_federated_data(cfg, train=False)


def resolve_task(cfg: Config, given: Task | None = None) -> Task:
    """The run's task: the one handed to the run, the registered one the config
    names, or the built-in one of its data set and model."""
    if given is not None:
        return given
    if cfg.task is None or cfg.task in BUILT_IN_TASKS:
        return config_task(cfg)
    _check_task_name(cfg.task)
    given_task: Task = TASKS[cfg.task](None)
    return given_task


def check_known(cfg: Config) -> None:
    """Refuse in one line, before anything loads, a task the config names that no
    one registered, or, for the config's own data set and model, a model neither
    built in nor registered (a registered task may bring its own model)."""
    if cfg.task is None or cfg.task in BUILT_IN_TASKS:
        check_model_name(cfg.model)
    else:
        _check_task_name(cfg.task)


def _check_task_name(name: str) -> None:
    if name not in TASKS:
        raise ConfigError(
            f"task {name!r} is unknown; built in: {', '.join(BUILT_IN_TASKS)}; registered: "
            f"{', '.join(TASKS) or 'none'} (fedforge.register_task before the run and its resume)"
        )


class GivenTask:
    """The factory of a task registered as it is: it returns the task."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def __call__(self, context: object) -> Task:
        return self.task


__all__ = [
    "TASKS",
    "LossFn",
    "Metrics",
    "Scores",
    "Task",
    "check_known",
    "cross_entropy",
    "load_server_data",
    "load_task_data",
    "register_task",
    "resolve_task",
    "squared_error",
    "token_cross_entropy",
]

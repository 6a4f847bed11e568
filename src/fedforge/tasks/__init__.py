"""Tasks: what a run trains and how it is judged (idea 8 of the design). A config
names a task (``task: shakespeare-lstm``), found in the one registry
(core/registry.py) whether built in (core/builtins.py) or registered by a caller
(:func:`register_task`), or gives the ``dataset``/``model`` pair; a caller may
also hand a :class:`Task` to ``fedforge.run``. A task factory takes a
``ComponentContext`` and returns the :class:`Task`."""

from __future__ import annotations

from fedforge.config import Config
from fedforge.config.components import make
from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.data import federated
from fedforge.data.federated import FederatedData
from fedforge.models import check_model_name
from fedforge.tasks.losses import LossFn, cross_entropy, squared_error, token_cross_entropy
from fedforge.tasks.metrics import Metrics, Scores
from fedforge.tasks.task import Task, config_task

TASKS = registry.view("task")  # every task by name, the built-ins' and the caller's


def register_task(task: Task, *, replace: bool = False) -> None:
    """Make ``task: <task.name>`` in a config run ``task``; registering a name of your
    own again replaces it, a built-in name only with ``replace=True``. Register
    before the run, and before its resume."""
    if not isinstance(task, Task):
        raise ConfigError(f"register_task takes a fedforge.Task, got {type(task).__name__}")
    if not task.name.strip():
        raise ConfigError(f"task name {task.name!r} cannot be registered: give a non-empty name")
    if registry.is_builtin("task", task.name) and not replace:
        raise ConfigError(
            f"task name {task.name!r} cannot be registered: it is a built-in task "
            f"({', '.join(_builtin_tasks())}); pass replace=True to replace it"
        )
    registry.register("task", task.name, GivenTask(task), replace=True)


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
    """The run's task: the one handed to the run, the one the config names (built
    by its registered factory), or that of the config's data set and model."""
    if given is not None:
        return given
    if cfg.task is None:
        return config_task(cfg)
    _check_task_name(cfg.task)
    task = make("task", cfg.task, cfg, "task")
    if not isinstance(task, Task):
        raise ConfigError(
            f"task {cfg.task!r}: its factory returned {type(task).__name__}, not a fedforge.Task"
        )
    return task


def check_known(cfg: Config) -> None:
    """Refuse in one line, before anything loads, a task the config names that no
    one registered, or a model the task trains by name that no one registered (a
    task may bring its own model)."""
    model = resolve_task(cfg).model
    if model is None or isinstance(model, str):
        check_model_name(model or cfg.model)


def _builtin_tasks() -> list[str]:
    return [n for n in registry.names("task") if registry.is_builtin("task", n)]


def _check_task_name(name: str) -> None:
    if not registry.is_registered("task", name):
        builtin = _builtin_tasks()
        own = [n for n in registry.names("task") if n not in builtin]
        raise ConfigError(
            f"task {name!r} is unknown; built in: {', '.join(builtin)}; registered: "
            f"{', '.join(own) or 'none'} (fedforge.register_task before the run and its resume)"
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

"""fedforge: federated learning for PyTorch, fast and reproducible to the bit.

The public names load on first use (``fedforge.run``, ``from fedforge import
Config``): importing the package alone imports no torch, so ``fedforge --help``
and argument errors answer at once and the subpackages that need no torch
(``fedforge.config``, ``fedforge.core.errors``) stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedforge.core.startup import load_torch

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    "WeightedMean": "fedforge.aggregation.mean",
    "register_aggregator": "fedforge.aggregation.named",
    "register_algorithm": "fedforge.algorithms",
    "ComponentContext": "fedforge.config.components",
    "register": "fedforge.core.registry",
    "load_plugin": "fedforge.core.registry",
    "register_codec": "fedforge.pipeline.named",
    "register_stage": "fedforge.pipeline.named",
    "register_selection": "fedforge.selection.named",
    "SelectionPolicy": "fedforge.selection.named",
    "SelectionRound": "fedforge.selection.named",
    "ClientHistory": "fedforge.selection.history",
    "register_server_optimizer": "fedforge.server.optimizers",
    "register_lr_rule": "fedforge.server.client_lr",
    "LrRule": "fedforge.server.client_lr",
    "LrRound": "fedforge.server.client_lr",
    "register_metric": "fedforge.tasks.metrics",
    "Algorithm": "fedforge.algorithms",
    "LocalPlan": "fedforge.algorithms",
    "fedavg": "fedforge.algorithms",
    "fedsgd": "fedforge.algorithms",
    "Config": "fedforge.config",
    "PartitionConfig": "fedforge.config",
    "load": "fedforge.config",
    "override": "fedforge.config",
    "ConfigError": "fedforge.core.errors",
    "DataError": "fedforge.core.errors",
    "FedforgeError": "fedforge.core.errors",
    "UploadError": "fedforge.core.errors",
    "ParamSpec": "fedforge.core.params",
    "FederatedData": "fedforge.data.federated",
    "load_federated_data": "fedforge.data.federated",
    "Partition": "fedforge.data.partition",
    "register_model": "fedforge.models",
    "ModelContext": "fedforge.models",
    "build": "fedforge.server.experiment",
    "RoundEnd": "fedforge.server.hooks",
    "RoundHook": "fedforge.server.hooks",
    "RoundInfo": "fedforge.server.hooks",
    "RunResult": "fedforge.server.loop",
    "resume": "fedforge.server.loop",
    "run": "fedforge.server.loop",
    "RunStore": "fedforge.store",
    "Task": "fedforge.tasks",
    "register_task": "fedforge.tasks",
}

__all__ = [
    "Algorithm",
    "ClientHistory",
    "ComponentContext",
    "Config",
    "ConfigError",
    "DataError",
    "FederatedData",
    "FedforgeError",
    "LocalPlan",
    "LrRound",
    "LrRule",
    "ModelContext",
    "ParamSpec",
    "Partition",
    "PartitionConfig",
    "RoundEnd",
    "RoundHook",
    "RoundInfo",
    "RunResult",
    "RunStore",
    "SelectionPolicy",
    "SelectionRound",
    "Task",
    "UploadError",
    "WeightedMean",
    "build",
    "fedavg",
    "fedsgd",
    "load",
    "load_federated_data",
    "load_plugin",
    "override",
    "register",
    "register_aggregator",
    "register_algorithm",
    "register_codec",
    "register_lr_rule",
    "register_metric",
    "register_model",
    "register_selection",
    "register_server_optimizer",
    "register_stage",
    "register_task",
    "resume",
    "run",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'fedforge' has no attribute {name!r}")
    load_torch()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: the next lookup finds it without this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


if TYPE_CHECKING:  # the names as the type checker sees them
    from fedforge.aggregation.mean import WeightedMean
    from fedforge.aggregation.named import register_aggregator
    from fedforge.algorithms import Algorithm, LocalPlan, fedavg, fedsgd, register_algorithm
    from fedforge.config import Config, PartitionConfig, load, override
    from fedforge.config.components import ComponentContext
    from fedforge.core.errors import ConfigError, DataError, FedforgeError, UploadError
    from fedforge.core.params import ParamSpec
    from fedforge.core.registry import load_plugin, register
    from fedforge.data.federated import FederatedData, load_federated_data
    from fedforge.data.partition import Partition
    from fedforge.models import ModelContext, register_model
    from fedforge.pipeline.named import register_codec, register_stage
    from fedforge.selection.history import ClientHistory
    from fedforge.selection.named import SelectionPolicy, SelectionRound, register_selection
    from fedforge.server.client_lr import LrRound, LrRule, register_lr_rule
    from fedforge.server.experiment import build
    from fedforge.server.hooks import RoundEnd, RoundHook, RoundInfo
    from fedforge.server.loop import RunResult, resume, run
    from fedforge.server.optimizers import register_server_optimizer
    from fedforge.store import RunStore
    from fedforge.tasks import Task, register_task
    from fedforge.tasks.metrics import register_metric

"""fedforge: federated learning for PyTorch, fast and reproducible to the bit."""

import gc
import sys

if "torch" not in sys.modules:  # fedforge starts the process's torch: typically a fresh process
    import torch  # noqa: F401

    # torch leaves ~170k objects that every full collection of the cyclic garbage
    # collector rescans; one such collection during fedforge's own imports cost
    # 75 ms of start-up here. Frozen, the collector skips them (reference counting
    # still frees them; they live as long as the process anyway). Left alone when
    # the caller imported torch first: then the process is theirs to tune.
    gc.freeze()

from fedforge.aggregation.mean import WeightedMean
from fedforge.algorithms import Algorithm, LocalPlan, fedavg, fedsgd
from fedforge.config import Config, PartitionConfig, load, override
from fedforge.core.errors import ConfigError, DataError, FedforgeError, UploadError
from fedforge.core.params import ParamSpec
from fedforge.data.federated import FederatedData, load_federated_data
from fedforge.data.partition import Partition
from fedforge.models import register_model
from fedforge.server.experiment import build
from fedforge.server.loop import RunResult, resume, run
from fedforge.store import RunStore

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "Config",
    "ConfigError",
    "DataError",
    "FederatedData",
    "FedforgeError",
    "LocalPlan",
    "ParamSpec",
    "Partition",
    "PartitionConfig",
    "RunResult",
    "RunStore",
    "UploadError",
    "WeightedMean",
    "build",
    "fedavg",
    "fedsgd",
    "load",
    "load_federated_data",
    "override",
    "register_model",
    "resume",
    "run",
]

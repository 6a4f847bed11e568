"""fedforge: federated learning for PyTorch, fast and reproducible to the bit."""

from fedforge.aggregators import WeightedMean
from fedforge.algorithms import Algorithm, LocalPlan, fedavg, fedsgd
from fedforge.config import Config, PartitionConfig, load, override
from fedforge.errors import ConfigError, DataError, FedforgeError, UploadError
from fedforge.experiment import FederatedData, build, load_federated_data
from fedforge.params import ParamSpec
from fedforge.server.loop import RunResult, run

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
    "PartitionConfig",
    "RunResult",
    "UploadError",
    "WeightedMean",
    "build",
    "fedavg",
    "fedsgd",
    "load",
    "load_federated_data",
    "override",
    "run",
]

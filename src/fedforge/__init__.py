"""fedforge: federated learning for PyTorch, fast and reproducible to the bit."""

import gc
import sys
from pathlib import Path


def _started_as_the_command(argv: list[str]) -> bool:
    """Whether this process is the ``fedforge`` command: ``python -m fedforge.cli``
    or the console script (``argv``: the interpreter's own, ``sys.orig_argv``)."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[i + 1 : i + 2] == ["fedforge.cli"]
        if arg == "-c":
            return False
        if not arg.startswith("-"):
            return Path(arg).name == "fedforge"
        i += 2 if arg in ("-X", "-W") else 1  # the options that take a separate value
    return False


try:
    if "torch" not in sys.modules:  # fedforge starts the process's torch: typically a fresh one
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
    from fedforge.tasks import Task, register_task
except KeyboardInterrupt:
    # Ctrl-C while the command starts (importing torch takes seconds): the one line
    # and exit status 130 of an interrupt after start-up (cli.main), not a
    # traceback. A program importing fedforge gets its KeyboardInterrupt.
    if not _started_as_the_command(getattr(sys, "orig_argv", sys.argv)):
        raise
    print("fedforge: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

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
    "Task",
    "UploadError",
    "WeightedMean",
    "build",
    "fedavg",
    "fedsgd",
    "load",
    "load_federated_data",
    "override",
    "register_model",
    "register_task",
    "resume",
    "run",
]

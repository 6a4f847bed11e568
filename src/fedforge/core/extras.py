"""The optional dependencies: which extra of the package installs a module, and
whether a module is installed (without importing it). The core (a simulation,
the Python API) needs none of them; pyproject.toml lists each extra's packages."""

from __future__ import annotations

import importlib.util

# top-level module -> the extra that installs it
EXTRAS = {
    "grpc": "deploy",
    "grpc_health": "deploy",
    "google": "deploy",  # google.protobuf
    "prometheus_client": "deploy",
    "plotly": "report",
    "starlette": "report",
    "uvicorn": "report",
    "tensorboard": "tensorboard",
    "mlflow": "mlflow",
    "pyarrow": "parquet",
    "ray": "ray",
}


def extra_of(module: str) -> str | None:
    """The extra that installs ``module`` (dotted names by their top level); None
    for a module that is no optional dependency."""
    return EXTRAS.get(module.split(".")[0])


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here; nothing is imported but its parents."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False

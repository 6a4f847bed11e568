"""Algorithm bundles, built from a config by :func:`from_config`: the factory
registered under the config's ``algorithm`` name (core/registry.py)."""

from __future__ import annotations

import torch

from fedforge.algorithms.base import Algorithm, LocalPlan, cross_entropy
from fedforge.algorithms.factories import (
    AlgorithmFactory,
    drops_stragglers,
    local_plan,
    register_algorithm,
    require_mean,
)
from fedforge.algorithms.fedavg import fedavg, fedsgd
from fedforge.algorithms.fedbn import fedbn, local_mask
from fedforge.algorithms.fedprox import fedprox
from fedforge.algorithms.local import (
    ClientJob,
    ClientTerms,
    LinearTerm,
    ServerStep,
    ServerTerms,
    StepContext,
    UpdateScale,
)
from fedforge.algorithms.perfedavg import perfedavg
from fedforge.algorithms.scaffold import scaffold
from fedforge.algorithms.subsets import subset_mask, with_local_params
from fedforge.algorithms.terms import (
    PendingClientTable,
    StatelessClientTerms,
    StatelessServerTerms,
    summed,
)
from fedforge.config import Config
from fedforge.config.components import make
from fedforge.core.params import ParamSpec


def from_config(
    cfg: Config,
    size: int | None = None,
    dtype: torch.dtype | None = None,
    spec: ParamSpec | None = None,
) -> Algorithm:
    """The algorithm bundle a config names, built by its registered factory with
    the model's ``spec`` and the run's ``dtype`` (SCAFFOLD keeps an ``[N, size]``
    table of client controls, FedBN the batch-norm entries of each client).
    ``size``: kept for callers that pass it; the spec says it."""
    del size
    algorithm = make("algorithm", cfg.algorithm, cfg, "algorithm", spec, dtype)
    if not isinstance(algorithm, Algorithm):
        raise TypeError(
            f"algorithm {cfg.algorithm!r}: its factory returned {type(algorithm).__name__}, "
            "not a fedforge.Algorithm"
        )
    return with_local_params(cfg, spec, dtype, algorithm)


__all__ = [
    "Algorithm",
    "AlgorithmFactory",
    "ClientJob",
    "ClientTerms",
    "LinearTerm",
    "LocalPlan",
    "PendingClientTable",
    "cross_entropy",
    "drops_stragglers",
    "fedavg",
    "fedbn",
    "fedprox",
    "fedsgd",
    "from_config",
    "local_mask",
    "subset_mask",
    "with_local_params",
    "local_plan",
    "perfedavg",
    "register_algorithm",
    "require_mean",
    "ServerStep",
    "ServerTerms",
    "StatelessClientTerms",
    "StatelessServerTerms",
    "StepContext",
    "UpdateScale",
    "scaffold",
    "summed",
]

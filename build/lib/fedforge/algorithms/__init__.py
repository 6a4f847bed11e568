"""Algorithm bundles, built from a config by :func:`from_config`."""

from __future__ import annotations

import torch

from fedforge.algorithms.base import Algorithm, LocalPlan, cross_entropy
from fedforge.algorithms.fedavg import fedavg, fedsgd
from fedforge.algorithms.fedbn import fedbn, local_mask
from fedforge.algorithms.fedprox import fedprox
from fedforge.algorithms.perfedavg import perfedavg
from fedforge.algorithms.scaffold import scaffold
from fedforge.config import Config
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.store.client_state import make_state_store, working_dir


def from_config(
    cfg: Config,
    size: int | None = None,
    dtype: torch.dtype | None = None,
    spec: ParamSpec | None = None,
) -> Algorithm:
    """The algorithm bundle a config names, its local plans in the configured
    ``precision``. SCAFFOLD keeps an ``[N, size]`` table of client controls in
    ``dtype`` (the run's), so it needs both; FedBN keeps the batch-norm entries of
    ``spec`` per client, so it needs the spec and dtype."""
    decay = cfg.lr_decay
    if cfg.algorithm == "perfedavg":
        pfa = cfg.perfedavg
        beta = pfa.outer_lr(cfg.lr)
        args = (pfa.alpha, beta, pfa.steps, pfa.variant, pfa.hvp, pfa.delta, decay)
        return perfedavg(cfg.batch_size, *args)
    plan = LocalPlan.from_config(cfg.local, cfg.local_epochs, cfg.batch_size, cfg.lr, cfg.precision)
    if cfg.algorithm == "fedsgd":  # one step: momentum has no effect, decay and clipping do
        return fedsgd(plan, decay)
    drop = cfg.stragglers.drop
    if cfg.algorithm == "fedprox":  # keeps stragglers' partial work unless told otherwise
        return fedprox(plan, cfg.mu, decay, drop if drop is not None else False)
    dropping = drop if drop is not None else True  # FedAvg and SCAFFOLD drop stragglers
    if cfg.algorithm == "scaffold":
        if size is None or dtype is None:
            raise ValueError("SCAFFOLD needs the model's size and dtype for its client controls")
        where = working_dir("scaffold")
        store = make_state_store(cfg.num_clients, size, dtype, where, remove_dir=True)
        return scaffold(plan, store, cfg.scaffold.option, decay, dropping)
    if cfg.algorithm == "fedbn":
        if spec is None or dtype is None:
            raise ValueError("FedBN needs the model's spec and dtype for its batch-norm table")
        mask = local_mask(spec)
        if not bool(mask.any()):
            raise ConfigError(
                f"algorithm 'fedbn' needs a model with batch norm; model {cfg.model!r} has "
                "none (use model: cnn_bn)"
            )
        where = working_dir("fedbn")
        store = make_state_store(cfg.num_clients, int(mask.sum()), dtype, where, remove_dir=True)
        return fedbn(plan, mask, store, decay, dropping)
    return fedavg(plan, decay, dropping)


__all__ = [
    "Algorithm",
    "LocalPlan",
    "cross_entropy",
    "fedavg",
    "fedbn",
    "fedprox",
    "fedsgd",
    "from_config",
    "perfedavg",
    "scaffold",
]

"""Algorithm bundles, built from a config by :func:`from_config`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

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
    algorithm = _bundle(cfg, size, dtype, spec)
    if cfg.precision == "fp32":
        return algorithm
    return dataclasses.replace(algorithm, plan_fn=_InPrecision(algorithm.plan_fn, cfg.precision))


@dataclass(frozen=True)
class _InPrecision:
    """A plan function whose plans run in ``precision`` (a class: it pickles)."""

    plan_fn: Callable[[int], LocalPlan]
    precision: str

    def __call__(self, round_idx: int) -> LocalPlan:
        return dataclasses.replace(self.plan_fn(round_idx), precision=self.precision)


def _bundle(
    cfg: Config, size: int | None, dtype: torch.dtype | None, spec: ParamSpec | None
) -> Algorithm:
    if cfg.algorithm == "fedsgd":
        loc = cfg.local  # one step: momentum has no effect, decay and clipping do
        return fedsgd(cfg.lr, cfg.lr_decay, loc.momentum, loc.weight_decay, loc.grad_clip)
    if cfg.algorithm == "perfedavg":
        pfa = cfg.perfedavg
        beta = pfa.beta if pfa.beta is not None else cfg.lr
        return perfedavg(
            cfg.batch_size,
            pfa.alpha,
            beta,
            pfa.steps,
            pfa.variant,
            pfa.hvp,
            pfa.delta,
            cfg.lr_decay,
        )
    loc, drop = cfg.local, cfg.stragglers.drop
    mom, wd, clip = loc.momentum, loc.weight_decay, loc.grad_clip
    e, b, lr, decay = cfg.local_epochs, cfg.batch_size, cfg.lr, cfg.lr_decay
    if cfg.algorithm == "fedprox":  # keeps stragglers' partial work unless told otherwise
        keep = drop if drop is not None else False
        return fedprox(e, b, lr, cfg.mu, decay, keep, mom, wd, clip)
    dropping = drop if drop is not None else True  # FedAvg and SCAFFOLD drop stragglers
    if cfg.algorithm == "scaffold":
        if size is None or dtype is None:
            raise ValueError("SCAFFOLD needs the model's size and dtype for its client controls")
        where = working_dir("scaffold")
        store = make_state_store(cfg.num_clients, size, dtype, where, remove_dir=True)
        option = cfg.scaffold.option
        return scaffold(e, b, lr, store, option, decay, dropping, mom, wd, clip)
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
        return fedbn(e, b, lr, mask, store, decay, dropping, mom, wd, clip)
    return fedavg(e, b, lr, decay, dropping, mom, wd, clip)


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

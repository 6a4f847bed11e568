"""Algorithm bundles, built from a config by :func:`from_config`."""

from __future__ import annotations

from fedforge.algorithms.base import Algorithm, LocalPlan, cross_entropy
from fedforge.algorithms.fedavg import fedavg, fedsgd
from fedforge.config import Config


def from_config(cfg: Config) -> Algorithm:
    """The algorithm bundle a config names."""
    if cfg.algorithm == "fedsgd":
        return fedsgd(cfg.lr, cfg.lr_decay)
    return fedavg(cfg.local_epochs, cfg.batch_size, cfg.lr, cfg.lr_decay)


__all__ = ["Algorithm", "LocalPlan", "cross_entropy", "fedavg", "fedsgd", "from_config"]

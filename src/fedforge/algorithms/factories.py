"""Algorithms by name: :func:`register_algorithm`, the factory contract, and the
built-in factories (registered by name in core/builtins.py, through the same
``register`` a plugin uses).

An algorithm factory takes a ``ComponentContext`` (config/components.py) and
returns an :class:`~fedforge.algorithms.base.Algorithm` bundle: the client plan
of each round (:func:`local_plan` reads the config's), the loss, what is shared,
and the optional parts a method adds: a gradient term (FedProx), per-client
state and server state (SCAFFOLD), entries each client keeps (FedBN), its own
local loop (Per-FedAvg) or the server's step from the aggregate, its state and
the updates' extra tensors (``server_step``: examples/fednova.py, qfedavg.py).
``context.options`` holds the options dataclass the factory was registered
with, parsed from ``plugin_options``; ``context.spec`` and ``context.dtype``
size state by the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fedforge.algorithms.base import Algorithm, LocalPlan
from fedforge.algorithms.fedavg import fedavg, fedsgd
from fedforge.algorithms.fedbn import fedbn, local_mask
from fedforge.algorithms.fedprox import fedprox
from fedforge.algorithms.perfedavg import perfedavg
from fedforge.algorithms.scaffold import scaffold
from fedforge.algorithms.subsets import subset_mask
from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.store.client_state import make_state_store, working_dir

if TYPE_CHECKING:
    from fedforge.config import Config
    from fedforge.config.components import ComponentContext


class AlgorithmFactory(Protocol):
    """Builds the algorithm a config names; called once per run (and per resume)."""

    def __call__(self, context: ComponentContext) -> Algorithm: ...


def register_algorithm(
    name: str,
    factory: AlgorithmFactory | Callable[[ComponentContext], Algorithm],
    *,
    options: type | None = None,
    replace: bool = False,
) -> None:
    """Register ``factory`` as the algorithm ``name`` (``algorithm: NAME`` in a
    config); ``options``: a dataclass of its options (``plugin_options: {NAME:
    {...}}``). A name taken raises ConfigError unless ``replace``."""
    registry.register("algorithm", name, factory, options=options, replace=replace)


def local_plan(cfg: Config) -> LocalPlan:
    """The client plan of a round as the config says it (epochs, batch size, lr,
    momentum, weight decay, clipping, precision): what FedAvg's clients run."""
    return LocalPlan.from_config(cfg.local, cfg.local_epochs, cfg.batch_size, cfg.lr, cfg.precision)


def require_mean(cfg: Config, algorithm: str, weights: str, why: str) -> None:
    """Refuse in one line a config whose aggregate is not the plain mean under
    ``weights`` (``aggregation.weights``), which ``algorithm`` needs: ``why``."""
    if cfg.aggregation.weights != weights or cfg.robust.aggregator != "mean":
        raise ConfigError(
            f"algorithm {algorithm!r} {why}: it needs aggregation.weights: {weights} and "
            f"robust.aggregator: mean (got {cfg.aggregation.weights!r}, "
            f"{cfg.robust.aggregator!r})"
        )


def drops_stragglers(cfg: Config, default: bool) -> bool:
    """Whether clients that did fewer epochs are dropped: the config's
    ``stragglers.drop``, else the algorithm's ``default``."""
    drop = cfg.stragglers.drop
    return drop if drop is not None else default


def fedavg_factory(context: ComponentContext) -> Algorithm:
    cfg = context.cfg
    return fedavg(local_plan(cfg), cfg.lr_decay, drops_stragglers(cfg, True))


def fedsgd_factory(context: ComponentContext) -> Algorithm:
    # one step: momentum has no effect, decay and clipping do
    return fedsgd(local_plan(context.cfg), context.cfg.lr_decay)


def fedprox_factory(context: ComponentContext) -> Algorithm:
    cfg = context.cfg  # keeps stragglers' partial work unless told otherwise
    return fedprox(local_plan(cfg), cfg.fedprox.mu, cfg.lr_decay, drops_stragglers(cfg, False))


def scaffold_factory(context: ComponentContext) -> Algorithm:
    cfg, spec, dtype = context.cfg, context.spec, context.dtype
    if spec is None or dtype is None:
        raise ValueError("SCAFFOLD needs the model's size and dtype for its client controls")
    pattern = cfg.scaffold.controls
    mask = None if pattern is None else subset_mask(spec, (), pattern)
    if mask is not None and not bool(mask.any()):
        raise ConfigError(
            f"scaffold.controls {pattern!r} matches no tensor of model {cfg.model!r}; "
            "its tensors: " + ", ".join(spec.names)
        )
    size = spec.size if mask is None else int(mask.sum())
    where = working_dir("scaffold")
    store = make_state_store(cfg.num_clients, size, dtype, where, remove_dir=True)
    plan, drop = local_plan(cfg), drops_stragglers(cfg, True)
    return scaffold(plan, store, cfg.scaffold.option, cfg.lr_decay, drop, mask)


def fedbn_factory(context: ComponentContext) -> Algorithm:
    cfg, spec, dtype = context.cfg, context.spec, context.dtype
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
    return fedbn(local_plan(cfg), mask, store, cfg.lr_decay, drops_stragglers(cfg, True))


def perfedavg_factory(context: ComponentContext) -> Algorithm:
    cfg = context.cfg
    pfa = cfg.perfedavg
    beta = pfa.outer_lr(cfg.lr)
    args = (pfa.alpha, beta, pfa.steps, pfa.variant, pfa.hvp, pfa.delta, cfg.lr_decay)
    return perfedavg(cfg.batch_size, *args)

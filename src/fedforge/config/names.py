"""Which config fields name registered components (core/registry.py), and the
check that each name is registered, run first when a config is checked: the
registry's names are a field's allowed values, its plugins loaded before."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedforge.core import registry
from fedforge.core.builtins import PLACED_BY

if TYPE_CHECKING:  # a Protocol of the fields read: schema.py imports this module
    from typing import Protocol

    class _Robust(Protocol):
        @property
        def aggregator(self) -> str: ...

    class _ServerOptimizer(Protocol):
        @property
        def kind(self) -> str: ...

    class _Communication(Protocol):
        @property
        def uplink(self) -> str: ...

        @property
        def downlink(self) -> str: ...

    class _Selection(Protocol):
        @property
        def policy(self) -> str: ...

    class _Local(Protocol):
        @property
        def lr_rule(self) -> str | None: ...

    class _Evaluation(Protocol):
        @property
        def metrics(self) -> tuple[str, ...]: ...

    class _Pipeline(Protocol):
        @property
        def client(self) -> tuple[str, ...]: ...

        @property
        def server(self) -> tuple[str, ...]: ...

    class Named(Protocol):
        @property
        def algorithm(self) -> str: ...

        @property
        def plugins(self) -> tuple[str, ...]: ...

        @property
        def model(self) -> str: ...

        @property
        def task(self) -> str | None: ...

        @property
        def robust(self) -> _Robust: ...

        @property
        def server_optimizer(self) -> _ServerOptimizer: ...

        @property
        def communication(self) -> _Communication: ...

        @property
        def selection(self) -> _Selection: ...

        @property
        def pipeline(self) -> _Pipeline: ...

        @property
        def evaluation(self) -> _Evaluation: ...

        @property
        def local(self) -> _Local: ...


def named(cfg: Named) -> list[tuple[str, str, str]]:
    """``(kind, config field, name)`` of every registered component ``cfg`` names."""
    return [
        ("algorithm", "algorithm", cfg.algorithm),
        ("aggregator", "robust.aggregator", cfg.robust.aggregator),
        ("server_optimizer", "server_optimizer.kind", cfg.server_optimizer.kind),
        ("codec", "communication.uplink", cfg.communication.uplink),
        ("codec", "communication.downlink", cfg.communication.downlink),
        ("selection", "selection.policy", cfg.selection.policy),
        *(("stage", "pipeline.client", name) for name in cfg.pipeline.client),
        *(("stage", "pipeline.server", name) for name in cfg.pipeline.server),
        *(("metric", "evaluation.metrics", name) for name in cfg.evaluation.metrics),
        *(("lr_rule", "local.lr_rule", name) for name in [cfg.local.lr_rule] if name),
    ]


def config_components(cfg: Named) -> list[tuple[str, str | None]]:
    """``(kind, name)`` of every component ``cfg`` names, its model and task too,
    and the stages its sections place (core/builtins.py's ``PLACED_BY``)."""
    placed = [
        ("stage", name)
        for name, field in PLACED_BY.items()
        if getattr(getattr(cfg, field.split(".")[0]), field.split(".")[1]) is not None
    ]
    return [(kind, name) for kind, _, name in named(cfg)] + [
        ("model", cfg.model),
        ("task", cfg.task),
        *placed,
    ]


def check_registered(cfg: Named) -> None:
    """Import the config's plugins (once each), then refuse in one line a name no
    one registered."""
    registry.load_plugins(cfg.plugins)
    for kind, field_name, name in named(cfg):
        registry.lookup(kind, name, field_name)

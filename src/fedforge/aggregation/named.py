"""Aggregators by name: :func:`register_aggregator` and the factory contract.

An aggregator factory takes a ``ComponentContext`` (config/components.py) and
returns an :class:`~fedforge.aggregation.mean.Aggregator`: ``aggregate(updates
[K, P], weights [K]) -> [P]`` over a round's cohort, ``start(size, dtype)`` for
a running accumulator when the rule is ``linear`` (it commutes with sums:
streaming, edge groups and secure aggregation can run it), ``needs_individual``
when it must see each update (median, Krum: refused under secure aggregation),
and a ``name``. Its parameters come from ``context.options`` (a plugin's) or
the config's ``robust`` section (the built-ins', robust/factories.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fedforge.aggregation.mean import Aggregator
from fedforge.core import registry

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext


class AggregatorFactory(Protocol):
    def __call__(self, context: ComponentContext) -> Aggregator: ...


def register_aggregator(
    name: str,
    factory: AggregatorFactory | Callable[[ComponentContext], Aggregator],
    *,
    options: type | None = None,
    replace: bool = False,
) -> None:
    """Register ``factory`` as the aggregator ``name`` (``robust.aggregator:
    NAME``); ``options`` as for every kind."""
    registry.register("aggregator", name, factory, options=options, replace=replace)

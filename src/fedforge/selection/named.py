"""Cohort selection policies by name: :func:`register_selection` and its contract.

A selection factory takes a ``ComponentContext`` (config/components.py) and
returns a :class:`SelectionPolicy`: given the round, the ids of the clients
that may be asked (sorted) and the cohort size the config asks for, the sorted
ids the round asks. It must draw its randomness from ``(seed, round_idx)``
(core/rng.py), never from global state, so that a rerun or a resume asks the
same clients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from fedforge.core import registry

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext


class SelectionPolicy(Protocol):
    def select(self, round_idx: int, among: Sequence[int], size: int) -> list[int]: ...


class SelectionFactory(Protocol):
    def __call__(self, context: ComponentContext) -> SelectionPolicy: ...


def register_selection(
    name: str,
    factory: SelectionFactory | Callable[[ComponentContext], SelectionPolicy],
    *,
    options: type | None = None,
    replace: bool = False,
) -> None:
    """Register ``factory`` as the cohort selection policy ``name``."""
    registry.register("selection", name, factory, options=options, replace=replace)

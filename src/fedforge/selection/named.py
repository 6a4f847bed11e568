"""Cohort selection policies by name: :func:`register_selection` and its contract.

A selection factory takes a ``ComponentContext`` (config/components.py) and
returns a :class:`SelectionPolicy`; the config names it as
``selection.policy`` (the built-in ``uniform``: McMahan et al. 2017's uniform
draw without replacement), its options under ``plugin_options``.

Each upload period the round hands the policy a :class:`SelectionRound`: the
ids that may be asked (every client in simulation; a deployment's connected
ones), how many to ask, what the server knows of each client
(:class:`~fedforge.selection.history.ClientHistory`) and a generator derived
from (seed, the period's first round). The policy returns exactly ``size``
distinct ids among them (the round sorts them, and refuses any other answer
in one line). Its only randomness is that generator, and its only input the
round, so a rerun or a resume after SIGKILL asks the same clients, on every
engine and in a deployment; a policy that keeps state of its own breaks that.

A policy other than ``uniform`` is refused with differential privacy, privacy
tiers and Poisson sampling: their accounting assumes a uniform sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fedforge.core import registry

if TYPE_CHECKING:
    import numpy as np

    from fedforge.config.components import ComponentContext
    from fedforge.selection.history import ClientHistories


@dataclass(frozen=True)
class SelectionRound:
    """What a policy decides a cohort from."""

    round_idx: int  # the upload period's first round (0-based): the cohort's round
    among: Sequence[int]  # the ids that may be asked, sorted
    size: int  # how many to ask: at least 1, at most len(among)
    history: ClientHistories  # what the server knows of every client, by id
    rng: np.random.Generator  # derived from (seed, round_idx): the policy's only randomness


class SelectionPolicy(Protocol):
    def select(self, round: SelectionRound) -> list[int]: ...


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

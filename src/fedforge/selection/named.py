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
tiers and Poisson sampling: their accounting assumes a uniform sample. Where
the server must not see a client's own numbers (secure aggregation) the
history holds no losses (``last_loss`` None for every client); a policy that
ranks clients by them says so with ``reads_losses = True`` and is refused there
in one line (:func:`check_sees_losses`) rather than choosing blind. Counts,
rounds and durations are the server's own observations: every policy sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fedforge.core import registry
from fedforge.core.errors import ConfigError

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


def check_sees_losses(policy: SelectionPolicy, name: str, hidden: str | None) -> None:
    """Refuse in one line a policy that reads the clients' reported losses
    (``reads_losses``) in a run whose privacy ``hidden`` (what, in words) keeps
    them from the server; None: the losses are reported."""
    if hidden is not None and getattr(policy, "reads_losses", False):
        raise ConfigError(
            f"selection.policy = '{name}' ranks clients by the training losses they "
            f"report, which {hidden} keeps from the server; use a policy that reads "
            "none (uniform, fairness_floor, deadline_aware)"
        )


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

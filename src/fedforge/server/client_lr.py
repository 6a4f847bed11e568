"""What the server tells each client of a round beyond the shared plan: its own
learning rate (``local.lr_rule``) and the bound it clips its delta to before
upload (``communication.clip_multiple``). Both travel in the task's
``LocalPlan`` (``lr``, ``upload_clip``), so every engine and a deployment's
clients (the plan in each TRAIN work) receive them the same way.

**Per-client learning rate.** A rule is a registered component of kind
``lr_rule`` (:func:`register_lr_rule`; built-ins in server/lr_rules.py): its
factory takes a ``ComponentContext`` and returns an :class:`LrRule`, asked once
per round for a scale of each cohort client's lr from an :class:`LrRound` (the
clients' example counts as the server knows them, what it knows of each client's
last rounds). The task's lr is the plan's (decayed) lr times the scale; a client
the answer leaves out keeps the plan's lr. A scale must be a positive finite
number (else one ``ConfigError`` line). A rule is a pure function of the round,
so a rerun and a resume give the same scales.

**Clip relative to recent norms.** The bound is ``clip_multiple`` times the
median norm, before the clients' clip, of the updates taken in the last
``robust.norm_window`` rounds (robust/typical_norm.py's ``typical_norm``; of an
even count the upper middle value, where the refusal bound takes the lower one
of the norms as decoded: each guards against the side an attacker would push). Each client
reports that norm in its update's header (``LocalPlan.report_norm``: every task
of such a run asks for it, the first round's too), so the bound follows the
clients' own steps as they grow or shrink, and a multiple below 1 clips the
larger share of the clients every round. The server cannot check a reported
norm against a clipped delta: it takes any finite non-negative number
(server/update_header.py), and the median is what keeps a minority of clients
from moving the bound past the honest ones' norms (of an even count, half the
clients reporting huge norms can loosen it, never tighten it: the clip is the
honest clients' own, and what holds an attacker is the server's refusal bound,
``robust.max_norm_multiple``, on the norms as decoded); an update that reports none
counts at its norm as decoded. A round with none behind it (the run's first)
sends no bound and its clients do not clip.

**The two together.** By default every client is held to the round's bounds,
whatever its lr: a client the rule speeds up moves farther and is clipped, or
refused past ``robust.max_norm_multiple``, where its step outgrows the others'.
With ``local.lr_rule_scales_bounds`` a client whose lr is s > 1 times the
plan's gets s times both bounds (the clip bound it is sent, and its room under
the refusal bound: robust/typical_norm.py), so the rule's choice is not undone;
a client slowed down keeps the round's bounds. Measured on a quantity skew
(benchmarks/client_lr.py), the default is the safer: the outsized updates the
bounds refuse at a 4x lr are better left out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.robust.typical_norm import typical_norm

if TYPE_CHECKING:
    import numpy as np

    from fedforge.algorithms.plan import LocalPlan
    from fedforge.client.runtime import ClientTask
    from fedforge.config import Config
    from fedforge.config.components import ComponentContext
    from fedforge.selection.history import ClientHistories, History


@dataclass(frozen=True)
class LrRound:
    """What a rule scales a round's learning rates from."""

    round_idx: int  # the round the tasks are for (0-based)
    cohort: Sequence[int]  # the clients that train, sorted
    sizes: np.ndarray  # every client's example count, by id (0: not known yet)
    history: ClientHistories  # what the server knows of every client, by id


class LrRule(Protocol):
    def scales(self, round: LrRound) -> Mapping[int, float]: ...


class LrRuleFactory(Protocol):
    def __call__(self, context: ComponentContext) -> LrRule: ...


def register_lr_rule(
    name: str,
    factory: LrRuleFactory | Callable[[ComponentContext], LrRule],
    *,
    options: type | None = None,
    replace: bool = False,
) -> None:
    """Register ``factory`` as the per-client learning-rate rule ``name``
    (``local.lr_rule``)."""
    registry.register("lr_rule", name, factory, options=options, replace=replace)


def own_scales(
    tasks: Sequence[ClientTask],
    rule: LrRule,
    cfg: Config,
    round_idx: int,
    sizes: np.ndarray,
    history: History,
) -> dict[int, float]:
    """The rule's checked lr scales of the clients of the round's ``tasks``."""
    if not tasks:
        return {}
    cohort = sorted(t.client_id for t in tasks)
    ask = LrRound(round_idx, cohort, sizes, history.view(sizes))
    return checked_scales(str(cfg.local.lr_rule), rule.scales(ask), ask)


def checked_scales(name: str, answer: Mapping[int, float], round: LrRound) -> dict[int, float]:
    """The rule's scales of the cohort's clients, or one line saying which is wrong."""
    cohort = set(round.cohort)
    scales: dict[int, float] = {}
    for client, scale in answer.items():
        if client not in cohort:
            continue
        try:
            value = float(scale)
        except (TypeError, ValueError):
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(
                f"local.lr_rule '{name}' gave client {client} the lr scale {scale!r} in round "
                f"{round.round_idx + 1}; a scale is a positive finite number"
            )
        scales[int(client)] = value
    return scales


def bound_rooms(scales: Mapping[int, float], cfg: Config) -> dict[int, float]:
    """The factor of the round's norm bounds each sped-up client gets under
    ``local.lr_rule_scales_bounds`` (its scale, where above 1); none without it."""
    if not cfg.local.lr_rule_scales_bounds:
        return {}
    return {c: s for c, s in scales.items() if s > 1.0}


def scaled_tasks(
    tasks: Sequence[ClientTask],
    scales: Mapping[int, float],
    rooms: Mapping[int, float] | None = None,
) -> list[ClientTask]:
    """``tasks`` with each scaled client's lr multiplied by its scale, and its
    clip bound (if any) by its room (``bound_rooms``)."""
    rooms = rooms or {}
    return [
        t
        if t.client_id not in scales
        else dataclasses.replace(
            t, plan=_scaled(t.plan, scales[t.client_id], rooms.get(t.client_id, 1.0))
        )
        for t in tasks
    ]


def _scaled(plan: LocalPlan, scale: float, room: float) -> LocalPlan:
    clip = None if plan.upload_clip is None else plan.upload_clip * room
    return dataclasses.replace(plan, lr=plan.lr * scale, upload_clip=clip)


def keeps_norms(cfg: Config) -> bool:
    """Whether the server remembers the norms of the updates it takes: a bound
    relative to them is set (the refusal's or the clients' clip)."""
    return cfg.robust.max_norm_multiple is not None or cfg.communication.clip_multiple is not None


def upload_clip(multiple: float | None, recent: Sequence[Sequence[float]]) -> float | None:
    """The round's clip bound: ``multiple`` x the median of the ``recent`` rounds'
    norms before the clients' clip; None (no clipping) when off or when no norm
    is behind the round."""
    if multiple is None:
        return None
    # the upper median: half the norms (one client of two) cannot pull it down and
    # clip every other update towards nothing; a high report only loosens the clip
    typical = typical_norm(recent, upper=True)
    return None if typical is None else multiple * typical


def with_upload_clip(plan: LocalPlan, cfg: Config, recent: Sequence[Sequence[float]]) -> LocalPlan:
    """The round's plan with its clip bound from the ``recent`` rounds' norms
    before the clients' clip (``LoopState.clip_norms``), asking each client to
    report its own; the plan as it is when ``communication.clip_multiple`` is off."""
    multiple = cfg.communication.clip_multiple
    if multiple is None:
        return plan
    bound = upload_clip(multiple, recent)
    return dataclasses.replace(plan, upload_clip=bound, report_norm=True)

"""The options of the built-in selection policies, as a config gives them under
``plugin_options`` by the policy's name (``plugin_options: {oort: {penalty: 2}}``),
each field's allowed values declared in its annotation (config/ranges.py).
This module imports no policy: checking a config's options loads nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fedforge.config.ranges import Range
from fedforge.core.errors import ConfigError


@dataclass(frozen=True)
class PowerOfChoiceOptions:
    """Cho, Wang and Joshi 2020's candidate set size d."""

    d: Annotated[int | None, Range(">= 1", null="twice the cohort")] = None


@dataclass(frozen=True)
class OortOptions:
    """Lai et al. 2021's knobs (their Algorithm 1 and the defaults of their code)."""

    # epsilon: the share of the cohort spent on clients never heard from, decaying
    # each round by ``exploration_decay`` down to ``exploration_min``
    exploration: Annotated[float, Range("[0, 1]")] = 0.9
    exploration_decay: Annotated[float, Range("(0, 1]")] = 0.98
    exploration_min: Annotated[float, Range("[0, 1]")] = 0.3
    # alpha: a client slower than the preferred duration T has its utility times
    # (T / t) ** alpha
    penalty: Annotated[float, Range(">= 0")] = 2.0
    # T in seconds; null: the ``duration_percentile``-th percentile of the known
    # durations, which the pacer raises by ``pacer_delta`` when utility stalls
    preferred_duration_s: Annotated[float | None, Range("> 0", null="from the durations")] = None
    duration_percentile: Annotated[float, Range("[0, 100]")] = 30.0
    pacer_window: Annotated[int, Range(">= 1", note="rounds")] = 20
    pacer_delta: Annotated[float, Range("[0, 100]", note="percentile points")] = 5.0
    # the exploited are drawn among those whose score is above this fraction of
    # the score ranked at the exploited count
    cut_off: Annotated[float, Range("[0, 1]")] = 0.95
    # the weight of the staleness bonus sqrt(staleness * log R / L)
    staleness: Annotated[float, Range(">= 0")] = 0.1
    # a statistical utility above this percentile of the explored clients' is cut
    # to it (the paper's outlier clipping: one client's claimed loss or example
    # count cannot outweigh the rest); 100: no clipping
    utility_percentile: Annotated[float, Range("(0, 100]")] = 95.0
    # a client never taken whose uploads were refused this many times leaves the
    # exploration pool (its loss never becomes known, so it would be explored in
    # every round it is drawn); it is asked only when the cohort cannot be filled
    # without it
    explore_refusals: Annotated[int, Range(">= 1", note="refused uploads")] = 2
    # the paper's blacklist: a client asked in more than this many rounds is not
    # asked again (the most-asked first, at most ``blacklist_max_share`` of the
    # clients that may be asked), so a few fast, high-loss clients cannot
    # dominate training; null: none
    blacklist_rounds: Annotated[int | None, Range(">= 1", null="no blacklist")] = None
    blacklist_max_share: Annotated[float, Range("[0, 1]")] = 0.3

    def check(self) -> None:
        if self.exploration_min > self.exploration:
            raise ConfigError(
                f"plugin_options.oort.exploration_min = {self.exploration_min} must be at "
                f"most exploration = {self.exploration}"
            )


@dataclass(frozen=True)
class FairnessFloorOptions:
    """Every client asked at least once in every ``period`` rounds."""

    period: Annotated[int, Range(">= 1", note="rounds")] = 10


@dataclass(frozen=True)
class DeadlineOptions:
    """Clients whose last measured round fits ``deadline_s``, and some never measured."""

    deadline_s: Annotated[float | None, Range("> 0", null="the median known duration")] = None
    explore: Annotated[float, Range("[0, 1]", note="the cohort's share of unmeasured")] = 0.1


@dataclass(frozen=True)
class GroupedRotationOptions:
    """Clients in ``groups`` fixed groups (seeded) that take turns, a group a cohort."""

    groups: Annotated[int | None, Range(">= 1", null="num_clients // cohort size")] = None
    seed: Annotated[int | None, Range(">= 0", null="the run's seed")] = None

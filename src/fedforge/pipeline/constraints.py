"""Constraints a stage (or codec) may declare in its ``constraints``, checked by
:class:`~fedforge.pipeline.pipeline.Pipeline` when it is built: the general
ones, about a cohort stage's place and the aggregator. Privacy's own (clip
before noise, secure aggregation) are in ``fedforge.privacy.constraints``.

Each is a frozen dataclass with ``check(pipeline, owner)``: None when the
pipeline suits ``owner`` (the part that declared it), else why it cannot work.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.aggregation.mean import Aggregator
from fedforge.pipeline.pipeline import CohortStage, Part, Pipeline


def _cohort_index(p: Pipeline, owner: Part) -> int:
    """Where ``owner`` is among the cohort stages (it is one: it declared a cohort
    stage's constraint)."""
    return next(i for i, s in enumerate(p.cohort) if s is owner)


def _order(stages: tuple[CohortStage, ...]) -> str:
    return ", ".join(s.name for s in stages)


@dataclass(frozen=True)
class FirstCohortStage:
    """``owner`` must be the first cohort stage. ``what`` names it in the refusal
    (e.g. "the simulated colluding attack"), ``why`` says why it must be first."""

    what: str
    why: str

    def check(self, pipeline: Pipeline, owner: Part) -> str | None:
        if _cohort_index(pipeline, owner) == 0:
            return None
        return (
            f"{self.what} '{owner.name}' must be the first cohort stage ({self.why}); "
            f"order: {_order(pipeline.cohort)}"
        )


@dataclass(frozen=True)
class LastCohortStage:
    """``owner`` must be the last cohort stage (``what``, ``why``: as above)."""

    what: str
    why: str

    def check(self, pipeline: Pipeline, owner: Part) -> str | None:
        if _cohort_index(pipeline, owner) == len(pipeline.cohort) - 1:
            return None
        return (
            f"{self.what} '{owner.name}' must be the last cohort stage ({self.why}); "
            f"order: {_order(pipeline.cohort)}"
        )


@dataclass(frozen=True)
class NeedsAggregator:
    """The pipeline's aggregator must be a ``kind`` (e.g. the fixed-denominator DP
    mean under central DP); ``why`` says why and what to use."""

    kind: type[Aggregator]
    why: str

    def check(self, pipeline: Pipeline, owner: Part) -> str | None:
        agg = pipeline.aggregator
        if isinstance(agg, self.kind):
            return None
        return f"'{owner.name}' with aggregator '{agg.name}': {self.why}"


@dataclass(frozen=True)
class Unusable:
    """A part that cannot work in any pipeline (e.g. a secure-aggregation modulus
    over 64 bits): built anyway, so the pipeline refuses it in order, with why."""

    why: str

    def check(self, pipeline: Pipeline, owner: Part) -> str | None:
        return self.why

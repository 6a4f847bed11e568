"""The constraints a stage (or codec) may declare in its ``constraints``, checked
by :class:`~fedforge.pipeline.pipeline.Pipeline` when it is built. Each is a
frozen dataclass with ``check(pipeline, owner)``: None when the pipeline suits
``owner`` (the part that declared it), else why it cannot work.

- a cohort stage's place: first (a simulated colluding attack rewrites the
  cohort before any gate), last (report weights are taken over what every gate
  accepted);
- the aggregator's kind (central DP's fixed-denominator mean);
- DP noise (DESIGN idea 2): it is calibrated to a clip norm, so a client stage
  clips, before any client noise, and no server upload stage (nor a cohort
  stage that may rewrite rows) runs between the clip and central noise;
  distributed DP needs secure aggregation;
- secure aggregation (Bonawitz et al. 2017) shows the server only the sum, so
  nothing may need an individual update (no cohort stage) and everything after
  DP is linear (a server upload stage runs on the sum);
- a part that cannot work at all (a modulus over 64 bits), refused with why.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.aggregation.mean import Aggregator
from fedforge.pipeline.pipeline import Codec, CohortStage, Part, Pipeline


def _cohort_index(p: Pipeline, owner: Part) -> int | None:
    """Where ``owner`` is among the cohort stages (None: it is not one, so it is
    neither first nor last)."""
    return next((i for i, s in enumerate(p.cohort) if s is owner), None)


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


@dataclass(frozen=True)
class CalibratedToClip:
    """``owner`` adds noise calibrated to the clip norm: some client stage clips,
    and when ``owner`` is a client stage it comes after the first clip; when it
    noises on the server (central DP), no server upload stage runs between the
    clip and it, nor a cohort stage other than a gate or a simulated attack (one
    could move an update past the bound the noise assumes; stages on the noised
    aggregate are post-processing and may run)."""

    def check(self, pipeline: Pipeline, owner: Part) -> str | None:
        clips = [i for i, s in enumerate(pipeline.client) if s.role == "clip"]
        if not clips:
            return f"'{owner.name}' adds noise calibrated to a clip norm, but no client stage clips"
        at = next((i for i, s in enumerate(pipeline.client) if s is owner), None)
        clip = pipeline.client[clips[0]].name
        if at is not None and at < clips[0]:
            return f"'{owner.name}' comes before '{clip}': noise is calibrated to the clipped norm"
        if at is not None:
            return None
        if pipeline.server_upload:
            stage = pipeline.server_upload[0].name
            return (
                f"server upload stage '{stage}' runs between '{clip}' and '{owner.name}': the "
                "noise is calibrated to the clipped norm, which it could change; run it on the "
                "noised aggregate (where: server_aggregate) or before the clip (pipeline.client)"
            )
        rewrites = [s.name for s in pipeline.cohort if s.role == "other"]
        if rewrites:
            return (
                f"cohort stage '{rewrites[0]}' (role 'other': it may rewrite updates) runs "
                f"between '{clip}' and '{owner.name}': the noise is calibrated to the clipped "
                "norm; declare role 'gate' if it only drops rows, or run it on the aggregate"
            )
        return None


def shows_only_sum(codec: Codec) -> bool:
    """Whether ``codec`` declares that the server sees only the cohort's sum."""
    return any(isinstance(c, ShowsOnlySum) for c in codec.constraints)


@dataclass(frozen=True)
class NeedsMasking:
    """``owner`` needs a codec under which the server sees only the sum (secure
    aggregation). ``why``: what ``owner`` does; ``exposed``: what the server would
    see without it."""

    why: str
    exposed: str

    def check(self, pipeline: Pipeline, owner: Part) -> str | None:
        if shows_only_sum(pipeline.codec):
            return None
        return (
            f"'{owner.name}' {self.why}: without secure aggregation (codec "
            f"'{pipeline.codec.name}') the server would see {self.exposed}; use "
            "privacy.secagg = true"
        )


@dataclass(frozen=True)
class ShowsOnlySum:
    """Declared by the secure-aggregation codec: the server sees only the sum, so
    the aggregator must work on a sum, no cohort stage can run (it needs the
    individual updates), every server upload stage must be linear (it runs once,
    on the sum), and so must every client stage after the last clip or noise
    stage (the server undoes them on the sum)."""

    def check(self, pipeline: Pipeline, owner: Part) -> str | None:
        agg = pipeline.aggregator
        if agg.needs_individual or not agg.linear:
            return (
                f"secure aggregation shows the server only the sum, but aggregator '{agg.name}' "
                "needs individual updates; use robust.aggregator = mean"
            )
        if pipeline.cohort:
            stage = pipeline.cohort[0].name
            return (
                f"secure aggregation hides each update, so the per-upload/cohort gate "
                f"'{stage}' cannot see it (it needs the individual updates); remove it "
                "(robust.norm_gate, colluding attacks, pipeline.server) or privacy.secagg"
            )
        nonlinear = [s.name for s in pipeline.server_upload if not s.linear]
        if nonlinear:
            return f"server upload stage '{nonlinear[0]}' is not linear: it cannot run on a sum"
        client = pipeline.client
        last_dp = max((i for i, s in enumerate(client) if s.role in ("clip", "noise")), default=-1)
        late = [s.name for s in client[last_dp + 1 :] if not s.linear]
        if late:
            return (
                f"client stage '{late[0]}' between DP and the secure-aggregation mask is not "
                "linear: the server could not undo it on the sum"
            )
        return None

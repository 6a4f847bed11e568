"""The constraints privacy's stages and codec declare (DESIGN idea 2), checked
when a pipeline is built: noise is calibrated to a clip norm, so a client stage
clips, before any client noise; distributed DP needs secure aggregation; secure
aggregation (Bonawitz et al. 2017) shows the server only the sum, so nothing
may need an individual update and everything after DP must be linear. (Central
DP's fixed-denominator mean is a ``pipeline.constraints.NeedsAggregator``.)
"""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.pipeline.pipeline import Codec, Part, Pipeline


@dataclass(frozen=True)
class CalibratedToClip:
    """``owner`` adds noise calibrated to the clip norm: some client stage clips,
    and when ``owner`` is a client stage it comes after the first clip."""

    def check(self, pipeline: Pipeline, owner: Part) -> str | None:
        clips = [i for i, s in enumerate(pipeline.client) if s.role == "clip"]
        if not clips:
            return f"'{owner.name}' adds noise calibrated to a clip norm, but no client stage clips"
        at = next((i for i, s in enumerate(pipeline.client) if s is owner), None)
        if at is not None and at < clips[0]:
            clip = pipeline.client[clips[0]].name
            return f"'{owner.name}' comes before '{clip}': noise is calibrated to the clipped norm"
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
    the aggregator must work on a sum, no cohort stage can run, every server
    upload stage must be linear, and so must every client stage after the last
    clip or noise stage (the server undoes them on the sum)."""

    def check(self, pipeline: Pipeline, owner: Part) -> str | None:
        agg = pipeline.aggregator
        if agg.needs_individual or not agg.linear:
            return (
                f"secure aggregation shows the server only the sum, but aggregator '{agg.name}' "
                "needs individual updates; use robust.aggregator = mean"
            )
        if pipeline.cohort:
            return (
                f"secure aggregation hides each update, so the per-upload/cohort gate "
                f"'{pipeline.cohort[0].name}' cannot see it; remove robust.norm_gate and "
                "colluding attacks"
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

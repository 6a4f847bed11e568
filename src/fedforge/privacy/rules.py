"""The order rules of the privacy stages (DESIGN idea 2), registered in
``pipeline.RULES`` when ``fedforge.privacy.parts`` is imported: noise is calibrated to
a clip norm, so clipping comes first; an error-feedback residual is taken after
client noise; central DP needs the fixed-denominator mean; distributed DP needs
secure aggregation; secure aggregation (Bonawitz et al. 2017) shows the server
only a sum, so everything after DP must be linear and nothing may need an
individual update. Each rule returns None or the reason the pipeline cannot work.
"""

from __future__ import annotations

from fedforge.pipeline.pipeline import RULES, Pipeline

CLIENT_NOISE = ("local_dp", "distributed_dp", "tiered_dp")  # noise added on the client
NOISE_STAGES = (*CLIENT_NOISE, "central_dp")


def _client_noise(p: Pipeline) -> tuple[list[str], str | None]:
    """The client stages' names and the first that adds noise (None: none does)."""
    names = [s.name for s in p.client]
    return names, next((n for n in names if n in CLIENT_NOISE), None)


def _clip_before_noise(p: Pipeline) -> str | None:
    names, first = _client_noise(p)
    noisy = [s.name for s in (*p.client, *p.server_aggregate) if s.name in NOISE_STAGES]
    if not noisy:
        return None
    if "clip" not in names:
        return f"'{noisy[0]}' adds noise calibrated to a clip norm, but no client stage clips"
    if first is not None and names.index(first) < names.index("clip"):
        return f"'{first}' comes before 'clip': noise is calibrated to the clipped norm"
    return None


def _residual_after_noise(p: Pipeline) -> str | None:
    names, first = _client_noise(p)
    if first is None:
        return None
    early = [n for n in names[: names.index(first)] if n.endswith("+ef") or n == "ef"]
    if early:
        return (
            f"error feedback '{early[0]}' keeps its residual before '{first}': the residual "
            "would hold un-noised data and leak it later; take it after noise"
        )
    return None


def _distributed_needs_masking(p: Pipeline) -> str | None:
    if "distributed_dp" in (s.name for s in p.client) and p.codec.name != "secagg":
        return (
            "'distributed_dp' adds only sigma / sqrt(n_min) per client: without secure "
            f"aggregation (codec '{p.codec.name}') the server would see each update with that "
            "fraction of the noise; use privacy.secagg = true"
        )
    return None


def _dp_weights_capped(p: Pipeline) -> str | None:
    central = any(s.name == "central_dp" for s in p.server_aggregate)
    if central and p.aggregator.name != "dp_mean":
        return (
            f"central DP with aggregator '{p.aggregator.name}': example-count weights let one "
            "client outweigh the clip bound; use the DP mean (uniform weights or a weight cap)"
        )
    return None


def _secagg_rules(p: Pipeline) -> str | None:
    if p.codec.name != "secagg":
        return None
    agg = p.aggregator
    if agg.needs_individual or not agg.linear:
        return (
            f"secure aggregation shows the server only the sum, but aggregator '{agg.name}' "
            "needs individual updates; use robust.aggregator = mean"
        )
    if p.cohort:
        return (
            f"secure aggregation hides each update, so the per-upload/cohort gate "
            f"'{p.cohort[0].name}' cannot see it; remove robust.norm_gate and colluding attacks"
        )
    nonlinear = [s.name for s in p.server_upload if not s.linear]
    if nonlinear:
        return f"server upload stage '{nonlinear[0]}' is not linear: it cannot run on a sum"
    names = [s.name for s in p.client]
    last_dp = max((i for i, n in enumerate(names) if n in ("clip", *CLIENT_NOISE)), default=-1)
    late = [s.name for s in p.client[last_dp + 1 :] if not s.linear]
    if late:
        return (
            f"client stage '{late[0]}' between DP and the secure-aggregation mask is not "
            "linear: the server could not undo it on the sum"
        )
    check = getattr(p.codec, "wrap_reason", None)
    return check() if callable(check) else None


RULES.extend(
    [
        _clip_before_noise,
        _residual_after_noise,
        _distributed_needs_masking,
        _dp_weights_capped,
        _secagg_rules,
    ]
)

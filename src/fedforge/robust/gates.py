"""The server's norm-outlier gate over the cohort (the client's own gate is
``fedforge.client.gate``).

``NormGate`` (server, cohort stage; trusts nothing): an update whose norm is an
outlier of the cohort's by the robust z-score of Iglewicz and Hoaglin ("How to
Detect and Handle Outliers", 1993), z = 0.6745 (x - median) / MAD, is refused
when z > ``threshold`` (3.5 in their rule). One-sided: only too-large updates
are refused (a small one cannot move the model far, and refusing it would only
cost an honest client of little data). When the MAD is zero the mean absolute
deviation stands in (z = (x - median) / (1.2533 MeanAD)); when both are zero no
update differs and none is refused. Fewer than three updates are not judged.
The per-upload checks (shape, dtype, finite values) are in
``server/round.py:check_update`` and run before this stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedforge.core.errors import ConfigError
from fedforge.pipeline.pipeline import CohortRole, CohortUpdates, StageContext, Where

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext


def median(values: torch.Tensor) -> torch.Tensor:
    """The median of a 1-D tensor (mean of the two middle values for an even count)."""
    s, k = values.sort().values, len(values)
    return s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) / 2


def robust_z(values: torch.Tensor) -> torch.Tensor:
    """The robust z-score of each value (zeros when all values are equal)."""
    x = values.to(torch.float64)
    med = median(x)
    dev = (x - med).abs()
    mad = median(dev)
    if mad > 0:
        return 0.6745 * (x - med) / mad
    mean_ad = dev.mean()
    if mean_ad > 0:
        return (x - med) / (1.253314 * mean_ad)
    return torch.zeros_like(x)


class NormGate:
    """Refuses updates whose norm has a robust z-score above ``threshold``."""

    name = "norm_gate"
    where: Where = "server_cohort"
    role: CohortRole = "gate"  # drops rows, passes the others on as they came
    constraints = ()

    def __init__(self, threshold: float = 3.5) -> None:
        if not threshold > 0:
            raise ConfigError(f"norm gate threshold {threshold!r} is invalid: must be > 0")
        self.threshold = threshold

    def apply(
        self, cohort: CohortUpdates, ctx: StageContext
    ) -> tuple[CohortUpdates, list[tuple[int, str]]]:
        if len(cohort.client_ids) < 3:
            return cohort, []
        norms = cohort.updates.norm(dim=1)
        z = robust_z(norms)
        keep = z <= self.threshold
        if bool(keep.all()):
            return cohort, []
        med = float(median(norms))
        refused = [
            (
                c,
                f"update norm {float(n):.4g} is an outlier (robust z = {float(s):.1f} > "
                f"{self.threshold}; cohort median norm {med:.4g})",
            )
            for c, n, s, k in zip(cohort.client_ids, norms, z, keep, strict=True)
            if not k
        ]
        kept = CohortUpdates(
            [c for c, k in zip(cohort.client_ids, keep, strict=True) if k],
            cohort.updates[keep],
            cohort.weights[keep],
            cohort.reports,
        )
        return kept, refused


def norm_gate_stage(context: ComponentContext) -> NormGate:
    """The built-in stage ``norm_gate`` (core/builtins.py): the cohort's updates of
    outlying norm refused at ``robust.norm_gate``, placed by that field."""
    threshold = context.cfg.robust.norm_gate
    if threshold is None:
        raise ConfigError(f"stage {context.name!r} gates at robust.norm_gate, which is unset")
    return NormGate(threshold)

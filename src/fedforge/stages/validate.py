"""Gates: the server's norm-outlier gate over the cohort, and the client's
held-out-loss gate before it uploads.

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

``ClientGate`` (client; trusts its own data only; seed 003, section 6.2): a
slice of each client's data (``holdout_fraction``, at least one example, drawn
from (seed, "holdout", client)) is kept out of training; after local training
the client compares the loss on it of the new local model with that of the
global model, and withholds its update, saying why, when the loss went up.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call

from fedforge.errors import ConfigError
from fedforge.params import ParamSpec
from fedforge.pipeline import CohortUpdates, StageContext, Where
from fedforge.rng import torch_generator

DataFn = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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


class ClientGate:
    """Splits each client's data into training and held-out parts, and judges a
    local model on the held-out part."""

    def __init__(
        self,
        data_fn: DataFn,
        holdout_fraction: float,
        seed: int,
        exempt: frozenset[int] = frozenset(),
    ) -> None:
        if not 0.0 < holdout_fraction < 1.0:
            raise ConfigError(
                f"holdout_fraction {holdout_fraction!r} is invalid: must be in (0, 1)"
            )
        self.data_fn, self.fraction, self.seed = data_fn, holdout_fraction, seed
        self.exempt = exempt  # simulated attackers: they skip the check

    def _split(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        x, y = self.data_fn(client_id)
        n = len(y)
        held = min(max(1, math.floor(self.fraction * n + 1e-9)), n - 1) if n >= 2 else 0
        perm = torch.randperm(n, generator=torch_generator(self.seed, "holdout", client_id))
        return x[perm], y[perm], held

    def train_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What the client trains on: its data without the held-out slice."""
        x, y, held = self._split(client_id)
        return x[held:], y[held:]

    def holdout(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, held = self._split(client_id)
        return x[:held], y[:held]

    def check(
        self,
        model: nn.Module,
        spec: ParamSpec,
        loss_fn: LossFn,
        client_id: int,
        start: torch.Tensor,
        local: torch.Tensor,
    ) -> str | None:
        """Why the update of ``local`` (trained from ``start``) must be withheld, or
        None when its held-out loss is not higher than the global model's."""
        x, y = self.holdout(client_id)
        if len(y) == 0 or client_id in self.exempt:
            return None  # a single example holds nothing out; an attacker sends anyway
        model.eval()
        with torch.no_grad():
            before = float(loss_fn(functional_call(model, spec.views(start), (x,)), y).mean())
            after = float(loss_fn(functional_call(model, spec.views(local), (x,)), y).mean())
        if math.isnan(after) or after > before:
            return (
                f"held-out loss rose from {before:.6g} to {after:.6g} on {len(y)} held-out examples"
            )
        return None

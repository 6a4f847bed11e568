"""What a client reports beside its update for the server's aggregation weights,
both halves: the quality weights' validation loss (after FOCUS, Chen et al. 2020)
and the class weights' label counts (rules in fedforge.aggregation.weights).

Client half (:class:`Reporter`, runs on the client, trusts its own data):

- ``quality``: the client holds out a validation split (``aggregation.quality_holdout`` of
  its examples, at least one when it has two or more, drawn from (seed,
  "validation", client); it never trains on it) and reports ``val_loss``, the mean
  cross-entropy there of the global model it received (for FedBN with its own
  batch norm over it), not of the model it trained: a client whose labels are
  noisy fits its own noise, but the consensus model does not. A client with a
  single example has nothing to hold out and reports the loss on that example.
- ``class``: the client reports ``label_counts``, how many of the examples it
  trained on carry each class: C integers in the update's JSON header, a real
  cost on the wire, counted in its bytes like everything it sends.

Server half (runs on the server, trusts nothing it decodes): :func:`read_report`
refuses an update whose report is missing or malformed (a loss that is not a
finite number >= 0, counts that are not C integers >= 0 summing to
``num_examples``), and :class:`ReportWeights`, a cohort stage after every gate,
sets the cohort's weights from the accepted clients' reports. Both rules need the
whole cohort (the softmax over its losses, its class totals N_c), so the server
gathers the cohort instead of keeping a running sum. Like ``num_examples`` the
reports are self-declared: a client that lies about them gains weight. With
``aggregation.weight_cap`` a client counts at most that many examples (its class counts
scaled down alike); a made-up low loss or a class no one else holds still gains.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from fedforge.aggregation.weights import class_weights, quality_weights
from fedforge.config import Config
from fedforge.config.compat import REPORTED_WEIGHTS
from fedforge.core.errors import UploadError
from fedforge.core.params import ParamSpec
from fedforge.core.rng import numpy_rng
from fedforge.data.federated import ClientDataFn
from fedforge.evaluation.evaluate import evaluate
from fedforge.pipeline.constraints import LastCohortStage
from fedforge.pipeline.pipeline import (
    CohortRole,
    CohortStage,
    CohortUpdates,
    Constraint,
    StageContext,
    Where,
)
from fedforge.tasks.metrics import Metrics


@dataclass(frozen=True)
class ClientReport:
    """What one accepted update reported, as the server read it."""

    num_examples: int
    val_loss: float | None = None  # quality
    label_counts: tuple[int, ...] | None = None  # class


class Reporter:
    """The client half: the validation split, and the report beside each update."""

    def __init__(
        self,
        data_fn: ClientDataFn,
        rule: str,
        num_classes: int,
        holdout: float,
        seed: int,
        metrics: Metrics | None = None,
    ) -> None:
        if rule not in REPORTED_WEIGHTS:
            raise ValueError(f"no client report for aggregation weights {rule!r}")
        if not 0.0 < holdout < 1.0:
            raise ValueError(f"validation holdout {holdout!r} must be in (0, 1)")
        self.data_fn, self.rule, self.num_classes = data_fn, rule, num_classes
        self.holdout, self.seed = holdout, seed
        self.metrics = metrics  # the task's: quality weighs the task's loss

    def _split(self, client_id: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(kept, validation) positions among the client's ``n`` examples, each in
        order; nothing is held out for class weights, nor from a single example."""
        if self.rule != "quality" or n < 2:
            return torch.arange(n), torch.arange(n if self.rule == "quality" else 0)
        held = min(max(1, round(self.holdout * n)), n - 1)
        perm = numpy_rng(self.seed, "validation", client_id).permutation(n)
        keep, val = np.sort(perm[held:]), np.sort(perm[:held])
        return torch.from_numpy(keep), torch.from_numpy(val)

    def train_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What the client trains on: its data without the validation split."""
        x, y = self.data_fn(client_id)
        if self.rule != "quality" or len(y) < 2:
            return x, y
        keep = self._split(client_id, len(y))[0]
        return x[keep], y[keep]

    def validation(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's validation split (quality weights)."""
        x, y = self.data_fn(client_id)
        val = self._split(client_id, len(y))[1]
        return x[val], y[val]

    def report(
        self, model: nn.Module, spec: ParamSpec, client_id: int, start: torch.Tensor
    ) -> dict[str, Any]:
        """The update's extra metadata: ``val_loss`` of ``start`` (the global model as
        the client starts from it) or the training data's ``label_counts``."""
        if self.rule == "quality":
            x, y = self.validation(client_id)
            loss = (
                evaluate(model, spec, start, x, y, metrics=self.metrics).loss
                if len(y)
                else math.nan
            )
            return {"val_loss": loss if math.isfinite(loss) else None}  # strict JSON: no NaN
        y = self.train_data(client_id)[1]
        counts = torch.bincount(y, minlength=self.num_classes)[: self.num_classes]
        return {"label_counts": [int(c) for c in counts.tolist()]}


def read_report(
    meta: Mapping[str, Any], rule: str, num_examples: int, num_classes: int
) -> ClientReport:
    """The report an update carries for ``rule``; raises UploadError naming what is
    wrong with it (nothing is read for the rules without reports)."""
    if rule == "quality":
        loss = meta.get("val_loss")
        if (
            not isinstance(loss, int | float)
            or isinstance(loss, bool)
            or not math.isfinite(loss)
            or loss < 0
        ):
            raise UploadError(
                f"val_loss {loss!r:.100} must be a finite number >= 0 (quality weights)"
            )
        return ClientReport(num_examples, val_loss=float(loss))
    if rule == "class":
        counts = meta.get("label_counts")
        good = (
            isinstance(counts, list)
            and len(counts) == num_classes
            and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
        )
        if not good or sum(counts) != num_examples:  # type: ignore[arg-type]
            raise UploadError(
                f"label_counts {counts!r:.200} must be {num_classes} integers >= 0 summing to "
                f"num_examples = {num_examples} (class weights)"
            )
        return ClientReport(num_examples, label_counts=tuple(counts))  # type: ignore[arg-type]
    return ClientReport(num_examples)


class ReportWeights:
    """The cohort stage that weighs each accepted update by its client's report."""

    where: Where = "server_cohort"
    role: CohortRole = "gate"  # sets the weights; the rows pass on as they came
    constraints: tuple[Constraint, ...] = (
        LastCohortStage(
            "the report weights", "weights are taken over the updates every gate accepted"
        ),
    )

    def __init__(self, rule: str, temperature: float = 1.0, cap: int | None = None) -> None:
        if rule not in REPORTED_WEIGHTS:
            raise ValueError(f"no report weights for aggregation weights {rule!r}")
        self.rule, self.temperature, self.cap = rule, temperature, cap
        self.name = f"weights:{rule}"

    def weights(
        self, reports: list[ClientReport], bounded: list[float] | None = None
    ) -> list[float]:
        """The weights of a cohort's reports, in order; ``bounded``: each client's
        example count as the server bounds it (server/registry.py; None: as
        reported), which its claimed size and class counts never exceed."""
        sizes = [float(r.num_examples) for r in reports] if bounded is None else bounded
        if self.rule == "quality":
            losses = [r.val_loss for r in reports]
            if any(v is None for v in losses):
                raise ValueError("quality weights need every client's val_loss")
            sizes = [float(self._capped(n)) for n in sizes]
            known = [float(v) for v in losses if v is not None]
            return quality_weights(sizes, known, self.temperature)
        counts = [r.label_counts for r in reports]
        if any(c is None for c in counts):
            raise ValueError("class weights need every client's label_counts")
        rows = [c for c in counts if c is not None]
        # a client counts at most its bounded size and ``cap``: its counts scaled alike
        scale = [
            self._capped(min(n, sum(c))) / sum(c) if sum(c) else 1.0
            for c, n in zip(rows, sizes, strict=True)
        ]
        return class_weights([[n * s for n in c] for c, s in zip(rows, scale, strict=True)])

    def _capped(self, n: float) -> float:
        """``n`` self-declared examples, at most ``cap`` of them counted."""
        return n if self.cap is None else min(n, self.cap)

    def apply(
        self, cohort: CohortUpdates, ctx: StageContext
    ) -> tuple[CohortUpdates, list[tuple[int, str]]]:
        reports = [cohort.reports[c] for c in cohort.client_ids]
        bounded = [float(w) for w in cohort.weights.tolist()]  # the intake's weights
        weights = torch.tensor(self.weights(reports, bounded), dtype=cohort.weights.dtype)
        return replace(cohort, weights=weights), []


def assemble(
    cfg: Config, data_fn: ClientDataFn, num_classes: int, metrics: Metrics | None = None
) -> tuple[Reporter | None, tuple[CohortStage, ...]]:
    """The client reporter and the cohort stage of ``cfg.aggregation.weights``
    (nothing for the rules without reports)."""
    rule = cfg.aggregation.weights
    if rule not in REPORTED_WEIGHTS:
        return None, ()
    reporter = Reporter(
        data_fn, rule, num_classes, cfg.aggregation.quality_holdout, cfg.seed, metrics
    )
    return reporter, (
        ReportWeights(rule, cfg.aggregation.quality_temperature, cfg.aggregation.weight_cap),
    )

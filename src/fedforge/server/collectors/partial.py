"""Partial aggregation on the workers that train the clients (``engine: ray``,
engines/partial.py): each worker judges its clients' updates exactly as the
intake would (``intake.judge``: form, norm bounds, bounded weight) and keeps
their weighted sum; the driver adds one :class:`WorkerShare` a worker into the
round's running sum and books each client's verdict as the intake books an
upload (bytes, faults, refusals logged with their reasons, the clients'
records). The driver receives O(workers x model), not O(cohort x model).

Only a round whose aggregate is the plain weighted mean of the updates as
decoded may be summed this way (:func:`summable`): no per-upload server
stage, no weights but the bounded example counts, no tensors beside the delta
for the algorithm's server half. A round that judges its uploads by the median
of their own norms (a run's first, under ``robust.max_norm_multiple``) is
summed in two passes (engines/partial.py): each worker keeps its taken uploads
(as they came, encoded) and reports their norms; the driver sets the bound from
the cohort's median and each worker sums its uploads within it. The round's
update diagnostics (their mean pairwise cosine, norms) are streaming sums
too: each worker keeps its own and the driver merges them.
Sums in another order than the serial engine's: equal to it to rounding
(1e-9 in float64), and the same from run to run (shares in worker order).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedforge.aggregation.mean import WeightedMean
from fedforge.pipeline.pipeline import Codec
from fedforge.server.collectors.intake import Limits, UpdateForm, judge, weighs_nothing
from fedforge.server.diagnostics import RoundDiagnostics
from fedforge.server.experiment import Experiment


@dataclass(frozen=True)
class Verdict:
    """One client's upload as its worker judged it."""

    client_id: int
    nbytes: int
    seconds: float
    why: str | None  # None: taken into the share's sum
    faulty: bool
    decoded: bool
    num_examples: int = 0
    train_loss: float = float("nan")
    norm: float = float("nan")
    weight: float = 0.0
    clip_norm: float = float("nan")  # its norm before the client's clip (Upload.clip_norm)


@dataclass
class WorkerShare:
    """A worker's clients of one round: their verdicts and the weighted sum of the
    taken updates (None: none taken)."""

    summing: UpdateSumming
    codec: Codec
    total: torch.Tensor | None = None
    weight: float = 0.0
    count: int = 0
    verdicts: list[Verdict] = field(default_factory=list)
    # the taken updates' directions and norms (server/diagnostics.py), when the run
    # logs them: merged into the round's
    diag: RoundDiagnostics | None = None
    # a round that waits: the uploads taken so far, kept to be summed when the
    # round is settled (client, message, seconds), and their norms
    kept: list[tuple[int, bytes, float]] = field(default_factory=list)
    kept_norms: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.summing.diagnose and self.diag is None and not self.summing.waits:
            size, overlap = self.summing.form.size, self.summing.overlap
            self.diag = RoundDiagnostics(size, updates=True, overlap=overlap)

    def add(self, client_id: int, data: bytes, seconds: float) -> None:
        s = self.summing
        judged = judge(s.form, self.codec, s.limits, client_id, s.round_idx, data)
        up = judged.upload
        base = (client_id, len(data), seconds)
        if judged.why is not None:
            self.verdicts.append(Verdict(*base, judged.why, judged.faulty, up is not None))
            return
        assert up is not None
        weight = s.limits.registry.weight(client_id, up.num_examples)
        if weight <= 0:
            why = weighs_nothing(client_id, up.num_examples, s.limits)
            self.verdicts.append(Verdict(*base, why, False, True))
            return
        if s.limits.waits:
            self.kept.append((client_id, data, seconds))
            self.kept_norms.append(up.norm)
            return
        if self.total is None:
            self.total = torch.zeros(s.form.size, dtype=s.form.dtype)
        self.total.add_(up.delta, alpha=weight)
        if self.diag is not None:
            self.diag.add(client_id, up.delta, up.train_loss)
        self.weight += weight
        self.count += 1
        taken = Verdict(*base, None, False, True, up.num_examples, up.train_loss, up.norm, weight)
        self.verdicts.append(dataclasses.replace(taken, clip_norm=up.clip_norm()))

    def report(self) -> list[float]:
        """The kept uploads' norms."""
        return self.kept_norms

    def settle(self, settled: Any) -> WorkerShare:
        """The kept uploads judged again under the settled round and summed; the
        verdicts given before kept."""
        assert isinstance(settled, UpdateSumming)
        share = settled.start(self.codec)
        share.verdicts = list(self.verdicts)
        for client_id, data, seconds in self.kept:
            share.add(client_id, data, seconds)
        return share


@dataclass(frozen=True)
class UpdateSumming:
    """What a worker needs to judge and sum one round's updates (engines/partial.py's
    ``Summing``): the run's update form and the round's limits, the limits'
    registry cut to the cohort (a worker needs no one else's declared count)."""

    form: UpdateForm
    limits: Limits
    round_idx: int
    diagnose: bool = False  # the round's diagnostics read each taken update
    overlap: bool = False  # ... and count its index set (server/index_overlap.py)

    def start(self, codec: Codec) -> WorkerShare:
        return WorkerShare(self, codec)

    @property
    def waits(self) -> bool:
        return self.limits.waits

    def settle(self, reports: Sequence[Any]) -> UpdateSumming:
        """The round's bound set by the median of the norms ``reports`` hold (the
        kept uploads of the workers whose clients the round keeps)."""
        relative = self.limits.relative
        if relative is None or not relative.waits:
            return self
        norms = [n for r in reports for n in r]
        limits = dataclasses.replace(self.limits, relative=relative.settled(norms))
        return dataclasses.replace(self, limits=limits)


def summable(exp: Experiment) -> bool:
    """Whether the run's rounds may be summed on the workers (see the module
    docstring)."""
    return (
        type(exp.pipeline.aggregator) is WeightedMean
        and exp.cfg.aggregation.weights == "num_examples"
        and not exp.pipeline.server_upload
        and exp.algorithm.server is None
    )

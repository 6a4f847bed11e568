"""The gathered collector: the robust rules (median, trimmed mean, Krum, Bulyan,
geometric median, clipping) and the cohort stages (a norm gate, simulated
colluding attackers) need the accepted updates together, as one ``[K, P]``
tensor. Runs on the server; trusts nothing it decodes (``intake.py``).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fedforge.aggregation.mean import Aggregator
from fedforge.core.errors import AggregationError
from fedforge.pipeline.pipeline import CohortUpdates, StageContext
from fedforge.robust import discount_faulty
from fedforge.server.collectors.base import Collected
from fedforge.server.collectors.intake import Upload
from fedforge.server.collectors.streaming import UploadPhase
from fedforge.store import ClientRecord


class Gathering:
    """A gathered round's accepted uploads: each delta is copied into the next row
    of one ``[capacity, P]`` tensor as it arrives and its own tensor dropped, so
    the round holds the cohort once (a list of deltas and then their stack held
    it twice). Rows are allocated on the first upload, in its dtype."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.uploads: list[Upload] = []
        self._rows: torch.Tensor | None = None

    def add(self, up: Upload) -> None:
        if self._rows is None:
            self._rows = torch.empty(self.capacity, up.delta.numel(), dtype=up.delta.dtype)
        n = len(self.uploads)
        if n == self.capacity:
            raise RuntimeError(f"more uploads than the {self.capacity} tasks of the round")
        row = self._rows[n]
        row.copy_(up.delta)
        up.delta = row
        self.uploads.append(up)

    def keep(self, kept: list[Upload]) -> None:
        """Keep only ``kept`` (a subsequence of the uploads, in order): their rows
        move up in place."""
        ids = {id(up) for up in kept}
        at = 0
        for up in self.uploads:
            if id(up) not in ids:
                continue
            if self._rows is not None and up.delta.data_ptr() != self._rows[at].data_ptr():
                self._rows[at].copy_(up.delta)
                up.delta = self._rows[at]
            at += 1
        self.uploads = list(kept)

    def updates(self) -> torch.Tensor:
        """The ``[K, P]`` accepted deltas so far, in arrival order (a view)."""
        assert self._rows is not None, "no upload gathered"
        return self._rows[: len(self.uploads)]


class GatheredCohort(UploadPhase):
    """The accepted updates as rows, then the cohort stages and the aggregator."""

    def _start(self) -> None:
        self.gathering = Gathering(len(self.cohort))  # the intake admits one a client

    def _accept(self, up: Upload) -> None:
        self.clients[up.client_id] = self.intake.record(up, math.nan)  # norm: after stages
        self.gathering.add(up)

    @property
    def holds(self) -> bool:
        """A cohort stage (a norm gate) may refuse an upload at the round's end too."""
        return self.intake.limits.waits or bool(self.exp.pipeline.cohort)

    def _hold(self, up: Upload) -> None:
        self._accept(up)  # the rows wait for the round's end anyway: judged in _finish

    def _finish(self) -> Collected:
        if self.intake.limits.waits:  # the round's own median bounds its rows
            self.gathering.keep(self.intake.settle(self.gathering.uploads))
        aggregate, used = self._aggregate()
        self.clients = {c: _with_norm(r, used[c]) for c, r in self.clients.items() if c in used}
        return self._collected(aggregate, None, [self.extras[c] for c in self.clients])

    def _aggregate(self) -> tuple[torch.Tensor | None, dict[int, float]]:
        """The aggregate (None if nothing is left) and the clients it used, each with
        the norm of the row it took (a colluding attacker's rewritten row, not its
        honest one). Uploads refused as malformed, non-finite or past a norm bound
        count among Krum's and Bulyan's f (``discount_faulty``)."""
        uploads = self.gathering.uploads
        if not uploads:
            return None, {}
        exp, log = self.exp, self.log
        cohort = CohortUpdates(
            [u.client_id for u in uploads],
            self.gathering.updates(),
            torch.tensor([u.weighed() for u in uploads], dtype=torch.float64),
            {u.client_id: u.report for u in uploads},
        )
        ctx = StageContext(log.round_idx, exp.cfg.seed)
        for stage in exp.pipeline.cohort:
            cohort, refused = stage.apply(cohort, ctx)
            for client_id, why in refused:
                log.reject(client_id, f"{stage.name}: {why}")
        if not cohort.client_ids:
            return None, {}
        too_few = self._too_few(len(cohort.client_ids))
        if too_few is not None:
            log.skip(too_few)
            return None, {}
        aggregator = self._aggregator()
        try:
            aggregate = aggregator.aggregate(cohort.updates, cohort.weights)
        except AggregationError as exc:  # e.g. Krum left with fewer than 2f + 3 updates
            log.skip(str(exc))
            return None, {}
        if self.diag is not None:
            losses = {u.client_id: u.train_loss for u in uploads}
            for c, row in zip(cohort.client_ids, cohort.updates, strict=True):
                self.diag.add(c, row, losses[c])
        norms = [float(row.norm()) for row in cohort.updates]  # as the upload's own norm
        return aggregate, dict(zip(cohort.client_ids, norms, strict=True))

    def _aggregator(self) -> Aggregator:
        configured = self.exp.pipeline.aggregator
        faulty = self.intake.faulty
        aggregator = discount_faulty(configured, faulty)
        if aggregator is not configured:
            f, lowered = configured.f, aggregator.f  # type: ignore[attr-defined]
            self.log.write(
                f"{aggregator.name}: f = {f} lowered to {lowered}: "
                f"{faulty} refused upload(s) were faulty"
            )
        return aggregator


def _with_norm(record: ClientRecord, norm: float) -> ClientRecord:
    return dataclasses.replace(record, update_norm=norm)

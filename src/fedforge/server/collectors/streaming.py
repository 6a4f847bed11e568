"""Collectors of one upload phase: every cohort client gets the payload, trains
and uploads once. The streaming weighted mean keeps a running sum (memory
O(model)): FedAvg's aggregation (McMahan et al. 2017) when the aggregator is
linear and no cohort stage needs the updates together. Runs on the server;
trusts nothing it decodes (``intake.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from fedforge.aggregation.mean import RunningWeightedSum
from fedforge.config.compat import cohort_size
from fedforge.core.errors import EngineError
from fedforge.engines.partial import PartialSum, Summing
from fedforge.server.collectors.base import UPLOAD, Collected, DenseCost, Phase, RoundLog
from fedforge.server.collectors.intake import Intake, Limits, Upload
from fedforge.server.collectors.partial import UpdateSumming, WorkerShare, summable
from fedforge.server.diagnostics import RoundDiagnostics
from fedforge.server.experiment import Experiment
from fedforge.store import ClientRecord


class UploadPhase:
    """The phase protocol of a round with one upload phase; a collector built on it
    says what it does with each accepted upload (``_accept``) and at the end."""

    def __init__(
        self,
        exp: Experiment,
        round_idx: int,
        cohort: Sequence[int],
        log: RoundLog,
        payload_bytes: int,
        dense: DenseCost,
        limits: Limits,
        diag: RoundDiagnostics | None = None,
    ) -> None:
        self.exp, self.log, self.dense, self.diag = exp, log, dense, diag
        self.cohort = list(cohort)  # each gets the payload; each may upload once
        self.intake = Intake(exp, round_idx, cohort, log, payload_bytes, limits, dense)
        self.clients: dict[int, ClientRecord] = {}
        self.extras: dict[int, dict[str, torch.Tensor]] = {}
        self.held: list[Upload] = []  # a round without norms behind it: until its end
        self._gone: set[int] = set()
        self._sent = 0  # payloads handed out
        self._done = False
        self._start()

    def _start(self) -> None:
        """What the collector sets up before the first upload."""

    def upcoming(self) -> tuple[str, list[int]] | None:
        return None if self._done else (UPLOAD, self.cohort)

    def next_phase(self) -> Phase | None:
        train = [c for c in self.cohort if c not in self._gone]
        self._sent = len(train)
        return Phase(UPLOAD, train=train)

    def reply(self, client_id: int, data: bytes) -> None:
        self.intake.bytes_up += len(data)  # nothing is asked of a client but its update

    def offer(self, client_id: int, data: bytes) -> str | None:
        if self._done or client_id in self._gone:  # too late, or after it was given up on
            self.intake.bytes_up += len(data)
            when = "its upload phase is over" if self._done else "it was reported gone"
            why = f"client {client_id}'s update came after {when}"
            self.log.reject(client_id, why)
            return why
        up = self.intake.take(client_id, data)
        if isinstance(up, str):
            return up
        self.extras[up.client_id] = up.extras
        if self.intake.limits.waits:  # judged by the round's own median at the end
            self._hold(up)
        else:
            self._accept(up)
        return None

    @property
    def holds(self) -> bool:
        """A round without norms behind it judges its uploads by their own median."""
        return self.intake.limits.waits

    def dropout(self, client_id: int) -> None:
        self._gone.add(client_id)

    def summing(self) -> Summing | None:
        """What workers need to sum the round's uploads themselves; None: each
        upload is offered (the default)."""
        return None

    def take_share(self, share: PartialSum) -> list[int]:
        raise EngineError(f"{type(self).__name__} takes no worker's summed uploads")

    def end_phase(self) -> None:
        self._done = True

    def _accept(self, up: Upload) -> None:
        raise NotImplementedError

    def _hold(self, up: Upload) -> None:
        """Keep an upload until the round's median norm is known."""
        self.held.append(up)

    def finish(self) -> Collected:
        """The held uploads within the round's bound are accepted, in arrival order;
        then the collector's own end (``_finish``). The uploads refused meanwhile
        are said in ``refused_at_end``."""
        mark = len(self.log.rejected)
        held, self.held = self.held, []
        for up in self.intake.settle(held):
            self._accept(up)
        collected = self._finish()
        collected.refused_at_end = {c: why for _, c, why in self.log.rejected[mark:]}
        return collected

    def _finish(self) -> Collected:
        raise NotImplementedError

    def _collected(
        self,
        aggregate: torch.Tensor | None,
        why: str | None,
        received: list[dict[str, torch.Tensor]],
        hops: int = 0,
        forwarded: tuple[int, int] = (0, 0),
    ) -> Collected:
        """The collection, with the round skipped for ``why`` when given: ``hops``
        payloads to the edges, and ``forwarded`` = (their dense float32 cost,
        bytes) of the messages from them."""
        clients = self.clients
        if why is not None:
            aggregate, clients, received = None, {}, []
            self.log.skip(why)
            if self.diag is not None:
                self.diag.clear()
        return Collected(
            aggregate,
            clients,
            received,
            self.intake.bytes_up + forwarded[1],
            self.intake.payload_bytes * (self._sent + hops),
            self.intake.float32_up + forwarded[0],
            self.dense.down * (self._sent + hops),
            hops,
            norms={c: self.intake.norms[c] for c in clients},
            clip_norms={c: self.intake.clip_norms[c] for c in clients},
        )

    def _too_few(self, accepted: int) -> str | None:
        cfg = self.exp.cfg
        need = cfg.robust.min_clients_of(cohort_size(cfg.num_clients, cfg.client_fraction))
        if accepted < need:
            return f"only {accepted} accepted update(s), fewer than min_clients = {need}"
        return None


class StreamingMean(UploadPhase):
    """The aggregator's running sum of accepted updates, weighted by ``num_examples``."""

    def _start(self) -> None:
        exp = self.exp
        self.acc = exp.pipeline.aggregator.start(exp.spec.size, exp.initial_params.dtype)

    def _accept(self, up: Upload) -> None:
        if self.diag is not None:  # accepted as it comes
            self.diag.add(up.client_id, up.delta, up.train_loss)
        self.clients[up.client_id] = self.intake.record(up, float(up.delta.norm()))
        self.acc.add(up.delta, up.weighed())

    def summing(self) -> Summing | None:
        """What the workers need to sum this round's uploads where they are
        trained (partial.py), or None where the round must see each upload."""
        if not summable(self.exp):
            return None
        limits = self.intake.limits
        cut = dataclasses.replace(limits, registry=limits.registry.only(self.cohort))
        form, diagnose = self.intake.form, self.diag is not None
        overlap = self.diag is not None and self.diag.overlap is not None
        return UpdateSumming(form, cut, self.intake.round_idx, diagnose, overlap)

    def take_share(self, share: PartialSum) -> list[int]:
        """A worker's share: each client's verdict booked as the intake books an
        upload, the taken ones' sum added to the round's; the clients whose
        uploads it holds."""
        assert isinstance(share, WorkerShare)  # the summing this collector gave
        intake = self.intake
        for v in share.verdicts:
            intake.bytes_up += v.nbytes
            if self._done or v.client_id in self._gone or intake._admit(v.client_id):
                raise EngineError(
                    f"a worker summed client {v.client_id}'s update, which round "
                    f"{intake.round_idx + 1} did not ask of it"
                )
            if v.why is not None:
                intake.faulty += v.faulty
                intake.float32_up += self.dense.up if v.decoded or v.faulty else 0
                self.log.reject(v.client_id, v.why)
                continue
            intake.accepted += 1
            intake.float32_up += self.dense.up
            intake.norms[v.client_id], intake.clip_norms[v.client_id] = v.norm, v.clip_norm
            self.extras[v.client_id] = {}
            self.clients[v.client_id] = ClientRecord(
                intake.round_idx,
                v.client_id,
                v.num_examples,
                v.train_loss,
                v.norm,
                v.nbytes,
                intake.payload_bytes,
            )
        if self.diag is not None and share.diag is not None:
            self.diag.merge(share.diag)
        if share.total is not None:
            assert isinstance(self.acc, RunningWeightedSum)  # summable(): a plain mean
            self.acc.add_sum(share.total, share.weight, share.count)
        return [v.client_id for v in share.verdicts]

    def _finish(self) -> Collected:
        aggregate = self.acc.result() if self.acc.count else None
        why = self._too_few(len(self.clients)) if self.acc.count else None
        return self._collected(aggregate, why, [self.extras[c] for c in self.clients])

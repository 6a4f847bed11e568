"""The buffer of buffered asynchronous aggregation (FedBuff, Nguyen et al. 2022,
Algorithm 1): updates arrive one at a time, each trained from the model of an
earlier server step, until ``size`` (K) were taken; then the server steps on
their staleness-weighted mean.

One buffer is one server step (one round of the records). An update is offered
with the round whose model it was trained from (``offer_from``); its staleness
s is the rounds between. Past ``asynchronous.max_staleness`` it is refused with
the reason, as any refusal; otherwise it passes the same intake as a
synchronous round's (decoding, the norm bounds, the per-upload stages, the
registry's weight), and enters the running sum with weight w_k s(s_k), w_k its
aggregation weight (``num_examples`` within the registry, or 1). The aggregate
is

    sum_k w_k s(s_k) delta_k / sum_k w_k,

normalised by the weights without the staleness factor, so that stale updates
shrink the step as the paper's division by K does (with equal weights it is the
paper's sum_k s(s_k) delta_k / K); with no staleness it is FedAvg's weighted
mean, to the bit. A client adds at most one update to a buffer. The simulator
feeds it by function calls (``server/buffered.py``); a deployment server from
the uploads it takes, each with the model version it handed out
(``transport/buffered_remote.py``).
Runs on the server; trusts nothing it decodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedforge.aggregation.staleness import StalenessWeight
from fedforge.engines.partial import Summing
from fedforge.server.collectors.base import Collected, DenseCost, RoundLog
from fedforge.server.collectors.intake import Limits, Upload
from fedforge.server.collectors.streaming import StreamingMean
from fedforge.server.diagnostics import RoundDiagnostics
from fedforge.server.experiment import Experiment


class Buffer(StreamingMean):
    """The updates of one server step, weighted by their staleness."""

    def summing(self) -> Summing | None:
        return None  # each update weighs by its own staleness

    def __init__(
        self,
        exp: Experiment,
        round_idx: int,
        log: RoundLog,
        payload_bytes: int,
        dense: DenseCost,
        limits: Limits,
        size: int,
        weight: StalenessWeight,
        diag: RoundDiagnostics | None = None,
    ) -> None:
        everyone: Sequence[int] = range(exp.cfg.num_clients)  # whoever was handed work
        super().__init__(exp, round_idx, everyone, log, payload_bytes, dense, limits, diag)
        self.round_idx, self.size, self.weight = round_idx, size, weight
        self.staleness: dict[int, int] = {}  # of each update offered and not refused early
        self.scaled = 0.0  # sum of w_k s(s_k) over the taken updates
        self.unscaled = 0.0  # sum of w_k

    @property
    def full(self) -> bool:
        """K updates were taken (or are held for the buffer's own median norm)."""
        return len(self.clients) + len(self.held) >= self.size

    def offer(self, client_id: int, data: bytes) -> str | None:
        """An update trained from this round's model (staleness 0)."""
        return self.offer_from(client_id, self.round_idx, data)

    def offer_from(self, client_id: int, trained_from: int, data: bytes) -> str | None:
        """An update trained from round ``trained_from``'s model: None when taken,
        else why it was refused (logged)."""
        staleness = self.round_idx - trained_from
        why = None
        if staleness < 0:
            why = f"it claims round {trained_from + 1}'s model, which is not served yet"
        elif self.full:
            why = f"the buffer of round {self.round_idx + 1} already holds {self.size} updates"
        else:
            why = self.weight.refusal(staleness)
        if why is not None:
            self.intake.bytes_up += len(data)  # it travelled all the same
            why = f"client {client_id}'s update refused: {why}"
            self.log.reject(client_id, why)
            return why
        if self._done or client_id in self._gone or client_id in self.intake.seen:
            return super().offer(client_id, data)  # refused there, with the reason
        self.staleness[client_id] = staleness
        up = self.intake.take(client_id, data, trained_from)
        if isinstance(up, str):
            return up
        self.extras[up.client_id] = up.extras
        if self.intake.limits.waits:  # judged by the buffer's own median at the end
            self._hold(up)
        else:
            self._accept(up)
        return None

    def _accept(self, up: Upload) -> None:
        if self.diag is not None:
            self.diag.add(up.client_id, up.delta, up.train_loss)
        self.clients[up.client_id] = self.intake.record(up, float(up.delta.norm()))
        w = up.weighed()
        scaled = w * self.weight(self.staleness[up.client_id])
        self.acc.add(up.delta, scaled)
        self.scaled += scaled
        self.unscaled += w

    def _finish(self) -> Collected:
        aggregate = self.acc.result() if self.acc.count else None
        if aggregate is not None and self.scaled != self.unscaled:  # stale updates shrink it
            aggregate = aggregate * (self.scaled / self.unscaled)
        why = None
        if aggregate is not None:
            need = self.exp.cfg.robust.min_clients_of(self.size)
            if len(self.clients) < need:
                why = (
                    f"only {len(self.clients)} accepted update(s), fewer than min_clients = {need}"
                )
        return self._collected(aggregate, why, [self.extras[c] for c in self.clients])

    def taken_staleness(self) -> list[int]:
        """The staleness of each update the buffer took, in client order."""
        return [self.staleness[c] for c in sorted(self.clients)]

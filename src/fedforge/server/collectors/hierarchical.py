"""Hierarchical aggregation's collector (Liu et al. 2020, "Client-edge-cloud
hierarchical federated learning"): clients belong to groups (an institution, a
network); each group's edge aggregates its clients' updates, and one edge update
per group goes to the server.

A client's group comes from ``fedforge.communication.groups``. Each edge
takes the weighted mean of its accepted updates (weights ``num_examples``) and
sends it dense in the run's dtype with their total weight, so the server's
weighted mean of edge updates is the flat FedAvg mean (up to float rounding).
An algorithm's tensors beside the delta (SCAFFOLD's delta c_k, which the server
sums) are summed by the edge and sent in the same message, so the server moves
its state by what really reached it.
The server -> edge -> client payload and the edge -> server updates really
cross the wire format; both hops are counted. Runs on the edges and the
server; the server decodes edge messages like any update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from fedforge.aggregation.mean import Accumulator
from fedforge.client.runtime import EXTRA_PREFIX, split_extras
from fedforge.core import wire
from fedforge.core.errors import UploadError
from fedforge.pipeline.codec import Dense
from fedforge.server.collectors.base import Collected
from fedforge.server.collectors.intake import Upload, check_extras
from fedforge.server.collectors.streaming import UploadPhase


class Edges:
    """One round's edge aggregators: running weighted sums, one per group."""

    def __init__(self, group_of: Sequence[int], size: int, dtype: torch.dtype) -> None:
        self.group_of = group_of
        self.size = size
        self.dtype = dtype
        self._sums: dict[int, torch.Tensor] = {}
        self._weights: dict[int, float] = {}
        self._extras: dict[int, dict[str, torch.Tensor]] = {}  # per group: name -> sum
        self.forwarded = 0  # edge-to-server messages sent by ``forward``
        self.received: list[dict[str, torch.Tensor]] = []  # the edges' sums, as decoded
        self.refused: str | None = None  # why the server refused an edge's sums (round skipped)

    def groups_of(self, client_ids: Sequence[int]) -> set[int]:
        """The groups the payload must reach for these clients."""
        return {self.group_of[c] for c in client_ids}

    def add(
        self,
        client_id: int,
        delta: torch.Tensor,
        weight: float,
        extras: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """Add an accepted update (and the algorithm's tensors beside it) to its edge."""
        g = self.group_of[client_id]
        if g not in self._sums:
            self._sums[g] = torch.zeros(self.size, dtype=self.dtype)
            self._weights[g] = 0.0
            self._extras[g] = {}
        self._sums[g].add_(delta.to(self.dtype), alpha=weight)
        self._weights[g] += weight
        sums = self._extras[g]
        for name, t in (extras or {}).items():
            if name in sums:
                sums[name].add_(t.to(self.dtype))
            else:
                sums[name] = t.to(self.dtype).clone()

    def forward(
        self,
        acc: Accumulator,
        round_idx: int,
        check_extras: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
    ) -> int:
        """Send each edge's mean (and its sums of the algorithm's tensors) to the
        server through the wire format; add the mean to ``acc`` with the edge's
        total weight and keep the sums, as ``check_extras`` accepts them, in
        ``received``. Returns the bytes sent."""
        self.forwarded = len(self._sums)
        self.received, self.refused = [], None
        sent = 0
        for g in sorted(self._sums):
            weight = self._weights[g]
            mean = self._sums[g] / weight
            sums = {EXTRA_PREFIX + k: v for k, v in self._extras[g].items()}
            data = wire.encode(
                {"delta": mean, **sums}, {"group": g, "round_idx": round_idx, "weight": weight}
            )
            sent += len(data)
            msg = wire.decode(data)
            own, extras = split_extras(msg.tensors)
            delta = Dense().decode(own, msg.meta, self.size, self.dtype)
            try:
                self.received.append(check_extras(extras))
            except UploadError as exc:  # e.g. finite control deltas whose sum overflowed
                self.refused = f"edge {g}: {exc}"
            w = msg.meta.get("weight")
            if not isinstance(w, int | float) or isinstance(w, bool) or not w > 0:
                raise UploadError(f"edge {g}: weight {w!r} must be a positive number")
            acc.add(delta, float(w))
        return sent


class HierarchicalMean(UploadPhase):
    """Each accepted update goes to its group's edge; at the end each edge sends
    its weighted mean, and the server takes the weighted mean of the edges'."""

    def _start(self) -> None:
        exp, comm = self.exp, self.exp.communication
        assert comm is not None and comm.group_of is not None
        dtype = exp.initial_params.dtype
        self.acc = exp.pipeline.aggregator.start(exp.spec.size, dtype)
        self.edges = Edges(comm.group_of, exp.spec.size, dtype)

    def _accept(self, up: Upload) -> None:
        if self.diag is not None:
            self.diag.add(up.client_id, up.delta, up.train_loss)
        self.clients[up.client_id] = self.intake.record(up, float(up.delta.norm()))
        self.edges.add(up.client_id, up.delta, up.weighed(), up.extras)

    def _finish(self) -> Collected:
        edges, round_idx = self.edges, self.intake.round_idx
        sent = edges.forward(self.acc, round_idx, lambda e: check_extras(self.exp, e))
        aggregate = self.acc.result() if self.acc.count else None
        why = self._too_few(len(self.clients)) if self.acc.count else None  # clients, not edges
        if why is None and edges.refused is not None:
            why = edges.refused  # an edge's message the server refused: its clients too
        hops = len(edges.groups_of(self.cohort))  # server <-> edge messages
        dense = self.dense.up * edges.forwarded + sum(self.dense.extras(e) for e in edges.received)
        return self._collected(aggregate, why, edges.received, hops, (dense, sent))

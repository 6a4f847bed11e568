"""Partial aggregation where the clients train (``engine: ray``): a worker checks
and sums its clients' updates and sends the driver one weighted sum and a small
record per client, so the driver receives O(workers x model) bytes a round,
not O(cohort x model).

The engine only carries these objects: what a check and a sum are is the
server's (``server/collectors/partial.py``), which builds a :class:`Summing`
for a round whose aggregation is a plain weighted mean, ships it to the
workers, and merges the :class:`PartialSum` each returns.

A round that judges its uploads by a figure of the whole cohort (the median of
their own norms, in a run's first round) is summed in two passes: each worker
trains and judges its clients and keeps what it would sum (``waits``), sends
the driver a small ``report`` (the norms); the driver ``settle``s the round
from the reports of the workers still there, and each worker sums its kept
uploads under the settled round (``PartialSum.settle``). The uploads stay where
they were trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from fedforge.pipeline.pipeline import Codec


class PartialSum(Protocol):
    """One worker's share of a round: its uploads checked and summed."""

    def add(self, client_id: int, data: bytes, seconds: float) -> None:
        """Check one encoded update and, if taken, add it to the sum (or keep it,
        when the round waits)."""
        ...

    def report(self) -> Any:
        """What the driver needs of the uploads kept in a round that waits (small)."""
        ...

    def settle(self, settled: Summing) -> PartialSum:
        """The share with its kept uploads judged and summed under ``settled``."""
        ...


class Summing(Protocol):
    """What a worker needs to check and sum a round's uploads (picklable)."""

    def start(self, codec: Codec) -> PartialSum:
        """An empty share, whose updates ``codec`` decodes (the worker's own uplink
        codec: the run's, loaded with the client runtime)."""
        ...

    @property
    def waits(self) -> bool:
        """Whether the shares keep their uploads until the round is settled."""
        ...

    def settle(self, reports: Sequence[Any]) -> Summing:
        """The round settled from the ``PartialSum.report`` of each worker whose
        clients the round keeps."""
        ...

"""Partial aggregation where the clients train (``engine: ray``): a worker checks
and sums its clients' updates and sends the driver one weighted sum and a small
record per client, so the driver receives O(workers x model) bytes a round,
not O(cohort x model).

The engine only carries these objects: what a check and a sum are is the
server's (``server/collectors/partial.py``), which builds a :class:`Summing`
for a round whose aggregation is a plain weighted mean, ships it to the
workers, and merges the :class:`PartialSum` each returns.
"""

from __future__ import annotations

from typing import Protocol

from fedforge.pipeline.pipeline import Codec


class PartialSum(Protocol):
    """One worker's share of a round: its uploads checked and summed."""

    def add(self, client_id: int, data: bytes, seconds: float) -> None:
        """Check one encoded update and, if taken, add it to the sum."""
        ...


class Summing(Protocol):
    """What a worker needs to check and sum a round's uploads (picklable)."""

    def start(self, codec: Codec) -> PartialSum:
        """An empty share, whose updates ``codec`` decodes (the worker's own uplink
        codec: the run's, loaded with the client runtime)."""
        ...

"""A per-client table whose rows live in other processes (``engine: ray``'s
workers, each holding the rows of the clients it trains).

The algorithm, codec and evaluation objects of a run keep references to their
tables; :func:`relocate` turns such a table, in place, into a
:class:`Relocated` one that sends every call to ``elsewhere`` (the shards), so
every holder (the checkpoint writer, FedBN's evaluation, the resumed run's
loader) reaches the rows where they now are, through the same object. Only an
empty table may move: rows written here would be lost to the workers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedforge.core.errors import StoreError
from fedforge.store.client_state import ClientStateStore, MemmapStateStore, MemoryStateStore


class Relocated:
    """A table's interface, every call answered by ``_elsewhere``."""

    num_clients: int
    size: int
    dtype: torch.dtype
    _elsewhere: ClientStateStore

    def gather(self, client_ids: Sequence[int]) -> torch.Tensor:
        return self._elsewhere.gather(client_ids)

    def scatter(self, client_ids: Sequence[int], values: torch.Tensor) -> None:
        self._elsewhere.scatter(client_ids, values)

    def has(self, client_id: int) -> bool:
        return self._elsewhere.has(client_id)

    def written(self) -> list[int]:
        return self._elsewhere.written()

    def clear(self) -> None:
        self._elsewhere.clear()

    def changed(self) -> list[int] | None:
        return self._elsewhere.changed()

    def mark_checkpointed(self) -> None:
        self._elsewhere.mark_checkpointed()


def relocatable(table: object) -> bool:
    """Whether :func:`relocate` can move ``table`` (one of the two built-in backends)."""
    return isinstance(table, MemoryStateStore | MemmapStateStore)


def relocate(table: ClientStateStore, elsewhere: ClientStateStore) -> None:
    """Make ``table`` (empty, of a built-in backend) answer from ``elsewhere`` from
    now on; a memory-mapped table's file is closed first."""
    if not relocatable(table):
        raise StoreError(f"a {type(table).__name__} table cannot move to other processes")
    if table.written():
        raise StoreError("a client-state table with rows cannot move to other processes")
    if isinstance(table, MemmapStateStore):
        table.close()
    shape = (table.num_clients, table.size, table.dtype)
    if (elsewhere.num_clients, elsewhere.size, elsewhere.dtype) != shape:
        raise StoreError(f"client-state rows elsewhere do not have the table's shape {shape}")
    table.__dict__.clear()
    table.__class__ = Relocated
    table.num_clients, table.size, table.dtype = shape
    table._elsewhere = elsewhere  # type: ignore[attr-defined]

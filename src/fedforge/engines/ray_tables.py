"""The per-client tables of ``engine: ray``, as the driver sees them: each
client's rows live in the worker that trains it (``owner``), and every table
call is sent there, grouped by worker. A checkpoint reads the written rows
through :meth:`ShardedRows.gather` in chunks (store/client_state.py:save_rows),
so the driver never holds the whole population's state; a resumed run writes
them back through :meth:`ShardedRows.scatter` to the workers that own them now.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

Call = Callable[[int, str, str, tuple[Any, ...]], Any]  # worker, table, method, args -> future
Get = Callable[[list[Any]], list[Any]]  # futures -> their values


class ShardedRows:
    """A table ``name`` of ``num_clients`` x ``size`` rows spread over ``workers``:
    client c's rows in worker ``c % workers``."""

    def __init__(
        self,
        name: str,
        num_clients: int,
        size: int,
        dtype: torch.dtype,
        workers: int,
        call: Call,
        get: Get,
    ) -> None:
        self.name, self.num_clients, self.size, self.dtype = name, num_clients, size, dtype
        self.workers = workers
        self._call, self._get = call, get

    def owner(self, client_id: int) -> int:
        return client_id % self.workers

    def _each(self, method: str, *args: Any) -> list[Any]:
        return self._get([self._call(w, self.name, method, args) for w in range(self.workers)])

    def _split(self, client_ids: Sequence[int]) -> dict[int, list[int]]:
        """Positions of ``client_ids`` by owning worker."""
        where: dict[int, list[int]] = {}
        for i, c in enumerate(client_ids):
            where.setdefault(self.owner(int(c)), []).append(i)
        return where

    def gather(self, client_ids: Sequence[int]) -> torch.Tensor:
        ids = [int(c) for c in client_ids]
        where = self._split(ids)
        futures = [
            self._call(w, self.name, "gather", ([ids[i] for i in pos],)) for w, pos in where.items()
        ]
        out = torch.empty(len(ids), self.size, dtype=self.dtype)
        for pos, rows in zip(where.values(), self._get(futures), strict=True):
            out[pos] = rows
        return out

    def scatter(self, client_ids: Sequence[int], values: torch.Tensor) -> None:
        ids = [int(c) for c in client_ids]
        futures = [
            self._call(w, self.name, "scatter", ([ids[i] for i in pos], values[pos].clone()))
            for w, pos in self._split(ids).items()
        ]
        self._get(futures)

    def has(self, client_id: int) -> bool:
        c = int(client_id)
        return bool(self._get([self._call(self.owner(c), self.name, "has", (c,))])[0])

    def written(self) -> list[int]:
        return sorted(c for part in self._each("written") for c in part)

    def clear(self) -> None:
        self._each("clear")

    def changed(self) -> list[int] | None:
        parts = self._each("changed")
        if any(p is None for p in parts):
            return None
        return sorted(c for p in parts for c in p)

    def mark_checkpointed(self) -> None:
        self._each("mark_checkpointed")

"""Each client's row numbers, for any number of clients, in two arrays.

A partition of 100,000 clients kept as 100,000 numpy arrays costs about 300
bytes of objects a client beside its indices (38 MiB at six rows a client);
:class:`IndexLists` keeps every client's rows in one flat int64 array and
where each client's run starts, and hands out read-only views: memory is the
indices alone, whatever the number of clients.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np


class IndexLists(Sequence[np.ndarray]):
    """Client k's rows are ``flat[starts[k]:starts[k + 1]]`` (read-only views)."""

    def __init__(self, flat: np.ndarray, starts: np.ndarray) -> None:
        self.flat, self.starts = flat, starts
        for arr in (flat, starts):
            arr.setflags(write=False)

    @classmethod
    def of(cls, arrays: Iterable[np.ndarray]) -> IndexLists:
        """From one int64 array per client."""
        parts = list(arrays)
        sizes = np.array([len(a) for a in parts], dtype=np.int64)
        starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        flat = np.concatenate([*parts, np.empty(0, dtype=np.int64)]).astype(np.int64, copy=False)
        return cls(flat, starts)

    def __len__(self) -> int:
        return len(self.starts) - 1

    @overload
    def __getitem__(self, k: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, k: slice) -> list[np.ndarray]: ...

    def __getitem__(self, k: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        n = len(self)
        i = int(k) + n if int(k) < 0 else int(k)
        if not 0 <= i < n:
            raise IndexError(f"client {k} out of range: 0..{n - 1}")
        return self.flat[self.starts[i] : self.starts[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self.flat[self.starts[i] : self.starts[i + 1]]

    def sizes(self) -> np.ndarray:
        """Each client's row count, int64."""
        return np.diff(self.starts)

    def __reduce__(self) -> tuple[type[IndexLists], tuple[np.ndarray, np.ndarray]]:
        return (IndexLists, (self.flat.copy(), self.starts.copy()))

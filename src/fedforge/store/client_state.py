"""Per-client persistent state: one row of ``size`` numbers per client.

Stages and algorithms that remember something per client between rounds
(error-feedback residuals, SCAFFOLD control variates, FedBN statistics) keep it
here, as rows of an ``[N, P]`` table: ``gather`` a cohort's rows as one
``[K, P]`` tensor, ``scatter`` them back after the round. A row nobody wrote
reads as the initial value (zeros unless an init vector is given).

Two backends with the same behaviour:

- :class:`MemoryStateStore` keeps the written rows in a dict of tensors;
- :class:`MemmapStateStore` keeps them in a file of ``[N, P]`` numbers created
  sparse (``truncate``) on the first write and read and written with
  ``pread``/``pwrite``, so 10,000 clients x 1.66M floats costs disk blocks only
  for the rows written, and RAM only for the rows in use (the page cache may
  hold more, but it is the kernel's to drop; nothing is mapped into the process).

:func:`make_state_store` picks memory when ``N * P * itemsize`` fits the budget.
Checkpoints write only the rows that were written (:func:`save_rows`,
:func:`load_rows`), packed and checksummed, whatever the backend; each table
counts the rows scattered since the last checkpoint (:meth:`_Rows.changed`), so
a checkpoint can write only those (store/segments.py).
Runs on the server (in simulation) and trusts its callers.
"""

from __future__ import annotations

import hashlib
import operator
import os
import secrets
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch

from fedforge.core.errors import StoreError
from fedforge.core.orphans import remove_if_owner, sweep_orphans

DEFAULT_MEMORY_BUDGET = 1 << 30  # 1 GiB
MEMMAP_NAME = "client_state.f{bits}.memmap"
_CHUNK_BYTES = 64 << 20  # per read/write when streaming a checkpoint (at least a row)


class ClientStateStore(Protocol):
    """``num_clients`` rows of ``size`` numbers of ``dtype``; unwritten rows read as init."""

    num_clients: int
    size: int
    dtype: torch.dtype

    def gather(self, client_ids: Sequence[int]) -> torch.Tensor: ...

    def scatter(self, client_ids: Sequence[int], values: torch.Tensor) -> None: ...

    def has(self, client_id: int) -> bool: ...

    def written(self) -> list[int]: ...

    def clear(self) -> None: ...

    def changed(self) -> list[int] | None: ...

    def mark_checkpointed(self) -> None: ...


def _init_vector(size: int, dtype: torch.dtype, init: torch.Tensor | None) -> torch.Tensor:
    if init is None:
        return torch.zeros(size, dtype=dtype)
    if tuple(init.shape) != (size,):
        raise StoreError(f"client state init has shape {tuple(init.shape)}; expected ({size},)")
    return init.detach().to(dtype).clone()


class _Rows:
    """Shape and id checks, and change tracking, shared by the backends."""

    num_clients: int
    size: int
    dtype: torch.dtype
    # rows scattered since the last checkpoint saved or loaded; None: no such
    # checkpoint (a new or cleared table), so the next one writes every row
    _changed: set[int] | None = None

    def changed(self) -> list[int] | None:
        """The rows scattered since :meth:`mark_checkpointed`, in id order; None
        when the table was never checkpointed or was cleared since."""
        return None if self._changed is None else sorted(self._changed)

    def mark_checkpointed(self) -> None:
        """A checkpoint now holds every row as it is: changes count from here."""
        self._changed = set()

    def _note_changed(self, ids: list[int]) -> None:
        if self._changed is not None:
            self._changed.update(ids)

    def _ids(self, client_ids: Sequence[int]) -> list[int]:
        try:  # an int, numpy or torch integer; a float id is a caller's bug
            ids = [operator.index(c) for c in client_ids]
        except TypeError:
            raise StoreError(f"client ids {list(client_ids)[:5]} must be integers") from None
        bad = [c for c in ids if not 0 <= c < self.num_clients]
        if bad:
            raise StoreError(
                f"client ids {bad[:5]} are out of range; allowed: 0..{self.num_clients - 1}"
            )
        return ids

    def _check_values(self, ids: list[int], values: torch.Tensor) -> None:
        if tuple(values.shape) != (len(ids), self.size):
            raise StoreError(
                f"client state values have shape {tuple(values.shape)}; "
                f"expected ({len(ids)}, {self.size})"
            )
        if len(set(ids)) != len(ids):
            raise StoreError(f"client ids {ids} repeat: each client is scattered at most once")


class MemoryStateStore(_Rows):
    """Written rows in a dict; unwritten rows are the init vector."""

    def __init__(
        self,
        num_clients: int,
        size: int,
        dtype: torch.dtype = torch.float32,
        init: torch.Tensor | None = None,
    ) -> None:
        self.num_clients, self.size, self.dtype = num_clients, size, dtype
        self._init = _init_vector(size, dtype, init)
        self._rows: dict[int, torch.Tensor] = {}

    def gather(self, client_ids: Sequence[int]) -> torch.Tensor:
        ids = self._ids(client_ids)
        out = torch.empty(len(ids), self.size, dtype=self.dtype)
        for i, c in enumerate(ids):
            out[i] = self._rows.get(c, self._init)
        return out

    def scatter(self, client_ids: Sequence[int], values: torch.Tensor) -> None:
        ids = self._ids(client_ids)
        self._check_values(ids, values)
        for i, c in enumerate(ids):
            self._rows[c] = values[i].detach().to(self.dtype).clone()
        self._note_changed(ids)

    def has(self, client_id: int) -> bool:
        return self._ids([client_id])[0] in self._rows

    def written(self) -> list[int]:
        return sorted(self._rows)

    def clear(self) -> None:
        self._rows.clear()
        self._changed = None


class MemmapStateStore(_Rows):
    """Rows in a file on disk, by plain reads and writes (nothing is mapped). The file
    is created on the first write with ``truncate`` (sparse: no blocks until a row
    is written); a mask in memory says which rows were written, so unwritten rows
    are never read. Rows are read with ``preadv`` straight into the gathered
    tensor and written with ``pwrite``: the process holds only the rows in use
    (a mapping counted every row ever read in its resident memory, 2 GB after one
    checkpoint of a 2 GB table), and a full disk fails a write with a StoreError
    (through a mapping it is a SIGBUS). ``remove_dir``: the directory is this
    store's working space, deleted when the store is collected or the process
    exits."""

    def __init__(
        self,
        num_clients: int,
        size: int,
        directory: Path | str,
        dtype: torch.dtype = torch.float32,
        init: torch.Tensor | None = None,
        remove_dir: bool = False,
    ) -> None:
        self.num_clients, self.size, self.dtype = num_clients, size, dtype
        self._init = _init_vector(size, dtype, init)
        self._np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        bits = self._np_dtype.itemsize * 8
        self.path = Path(directory) / MEMMAP_NAME.format(bits=bits)
        self._written = np.zeros(num_clients, dtype=bool)
        self._fd: int | None = None
        self._closed = False
        if remove_dir:
            weakref.finalize(self, remove_if_owner, Path(directory), os.getpid())

    def _open(self) -> int:
        if self._closed:
            raise StoreError(f"client state '{self.path}' was closed: its rows are gone")
        if self._fd is None:
            nbytes = self.num_clients * self.size * self._np_dtype.itemsize
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "wb") as f:  # a fresh file: old contents are not state
                    f.truncate(nbytes)
                self._fd = os.open(self.path, os.O_RDWR)
                self._close_fd = weakref.finalize(self, os.close, self._fd)
            except OSError as exc:
                raise StoreError(f"cannot create client state file '{self.path}': {exc}") from None
        return self._fd

    def gather(self, client_ids: Sequence[int]) -> torch.Tensor:
        ids = self._ids(client_ids)
        out = torch.empty(len(ids), self.size, dtype=self.dtype)
        row_bytes = self.size * self._np_dtype.itemsize
        for i, c in enumerate(ids):
            if not self._written[c]:
                out[i] = self._init
                continue
            fd = self._open()
            try:
                done = os.preadv(fd, [_bytes(out[i].numpy())], c * row_bytes)
            except OSError as exc:
                raise StoreError(
                    f"cannot read client {c}'s state from '{self.path}': {exc}"
                ) from None
            if done != row_bytes:
                raise StoreError(
                    f"client {c}'s state in '{self.path}': {done} of {row_bytes} bytes read"
                )
        return out

    def scatter(self, client_ids: Sequence[int], values: torch.Tensor) -> None:
        ids = self._ids(client_ids)
        self._check_values(ids, values)
        rows = values.detach().to(self.dtype).cpu().numpy()
        self._open()
        assert self._fd is not None
        row_bytes = self.size * self._np_dtype.itemsize
        for i, c in enumerate(ids):
            data = np.ascontiguousarray(rows[i]).tobytes()
            try:
                done = os.pwrite(self._fd, data, c * row_bytes)
            except OSError as exc:
                raise StoreError(
                    f"cannot write client {c}'s state to '{self.path}': {exc}"
                ) from None
            if done != len(data):  # a short write: the disk filled up
                raise StoreError(
                    f"cannot write client {c}'s state to '{self.path}': {done} of "
                    f"{len(data)} bytes written (disk full?)"
                )
            self._written[c] = True
            self._note_changed([c])

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled for another process (a Ray worker): an empty table of the same
        shape in a fresh working folder there. Its rows are in this process's file
        and travel by checkpoint (:func:`save_rows`), never with the object."""
        if self._written.any():
            raise StoreError(
                f"client state '{self.path}' holds rows: they cannot travel with the "
                "table to another process"
            )
        return (_empty_memmap, (self.num_clients, self.size, self.dtype, self._init))

    def has(self, client_id: int) -> bool:
        return bool(self._written[self._ids([client_id])[0]])

    def written(self) -> list[int]:
        return [int(c) for c in np.flatnonzero(self._written)]

    def clear(self) -> None:
        self._written[:] = False
        self._changed = None

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        """Flush and close the file; the store is unusable after (a reopened file
        would start empty while the mask still listed the rows written)."""
        self.flush()
        if self._fd is not None:
            self._close_fd()  # runs once: not again when the store is collected
            self._fd = None
        self._closed = True


def make_state_store(
    num_clients: int,
    size: int,
    dtype: torch.dtype = torch.float32,
    directory: Path | str | None = None,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
    init: torch.Tensor | None = None,
    remove_dir: bool = False,
) -> ClientStateStore:
    """In memory when the full table (``num_clients * size * itemsize`` bytes) fits
    ``memory_budget_bytes``, else memory-mapped in ``directory`` (deleted with the
    store when ``remove_dir``)."""
    if num_clients < 1 or size < 1:
        raise StoreError(f"client state shape ({num_clients}, {size}) must be positive")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = num_clients * size * itemsize
    if nbytes <= memory_budget_bytes:
        return MemoryStateStore(num_clients, size, dtype, init)
    if directory is None:
        raise StoreError(
            f"client state of {num_clients} x {size} x {itemsize} B = {nbytes} B exceeds the "
            f"memory budget of {memory_budget_bytes} B and no directory was given for the "
            "memory-mapped file"
        )
    return MemmapStateStore(num_clients, size, directory, dtype, init, remove_dir)


def _empty_memmap(
    num_clients: int, size: int, dtype: torch.dtype, init: torch.Tensor
) -> MemmapStateStore:
    """A pickled :class:`MemmapStateStore` as it arrives: empty, in a folder of its own."""
    return MemmapStateStore(num_clients, size, working_dir("state"), dtype, init, remove_dir=True)


_WORKING_PREFIX = "fedforge-state-"  # then the pid: see fedforge/orphans.py


def working_dir(kind: str) -> Path:
    """A fresh directory name in the temp folder for this process's ``kind`` of
    table (``fedforge-state-<pid>-<kind>-<hex>``); first, the tables of processes
    that no longer exist (runs killed with SIGKILL) are deleted."""
    root = Path(tempfile.gettempdir())
    sweep_orphans(root, _WORKING_PREFIX)
    return root / f"{_WORKING_PREFIX}{os.getpid()}-{kind}-{secrets.token_hex(3)}"


# ----------------------------------------------------------------------------- checkpoints


def save_rows(
    store: ClientStateStore, path: Path, ids: Sequence[int] | None = None
) -> tuple[list[int], str]:
    """Write rows ``ids`` (default: every written row), packed in id order as raw
    little-endian numbers, to ``path`` (streamed in chunks: memory stays
    O(chunk)); return the ids and the file's sha256."""
    ids = store.written() if ids is None else sorted(ids)
    digest = hashlib.sha256()
    rows = _chunk_rows(store)
    with open(path, "wb") as f:
        for start in range(0, len(ids), rows):
            chunk = store.gather(ids[start : start + rows]).numpy()
            raw = _bytes(chunk.astype(chunk.dtype.newbyteorder("<"), copy=False))
            digest.update(raw)
            f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    return ids, digest.hexdigest()


def _bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous ``array``, without a copy (read or written)."""
    return memoryview(cast(Any, array)).cast("B")


def _chunk_rows(store: ClientStateStore) -> int:
    """Rows per checkpoint chunk: 64 MiB of them, at least one."""
    row_bytes = store.size * torch.empty(0, dtype=store.dtype).element_size()
    return max(1, _CHUNK_BYTES // row_bytes)


def rows_sha256(path: Path) -> str:
    """The sha256 of a file written by :func:`save_rows`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_rows(store: ClientStateStore, path: Path, ids: Sequence[int], clear: bool = True) -> None:
    """Scatter the rows of ``path`` (from :func:`save_rows`) back into ``store``,
    cleared first unless ``clear`` is False (a later segment of a chain)."""
    np_dtype = torch.empty(0, dtype=store.dtype).numpy().dtype.newbyteorder("<")
    row_bytes = store.size * np_dtype.itemsize
    if path.stat().st_size != len(ids) * row_bytes:
        raise StoreError(
            f"client state file '{path}' holds {path.stat().st_size} bytes; expected "
            f"{len(ids)} rows of {row_bytes}"
        )
    if clear:
        store.clear()
    per_chunk = _chunk_rows(store)
    with open(path, "rb") as f:
        for start in range(0, len(ids), per_chunk):
            chunk = list(ids[start : start + per_chunk])
            raw = bytearray(f.read(len(chunk) * row_bytes))  # writable: torch wants it
            rows = np.frombuffer(raw, dtype=np_dtype).reshape(len(chunk), store.size)
            native = rows.astype(np_dtype.newbyteorder("="), copy=False)  # a view here
            store.scatter(chunk, torch.from_numpy(native))

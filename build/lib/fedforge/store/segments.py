"""Per-client tables in checkpoints, written incrementally.

In a checkpoint a table's rows are a chain of segment files, oldest first, each
the rows listed with it (packed by :func:`~fedforge.store.client_state.save_rows`);
a row's value is in the newest segment that lists it. A new checkpoint writes
one segment, of the rows scattered since the previous checkpoint this process
saved or loaded (:meth:`~fedforge.store.client_state._Rows.changed`), and
hard-links that checkpoint's segments into its own directory: every checkpoint
directory is complete on its own (it is renamed into place and pruned as one),
and the disk holds each unchanged row once, not once per checkpoint. With
10,000 clients x 1.66M floats, a checkpoint of a round that touched 100 clients
writes 100 rows, not every row written so far (66 GB).

The chain is written again in full, one segment of every written row, when
there is no previous checkpoint to build on (a new or cleared table, the
previous directory gone, or a file system without hard links), when a previous
segment's file is not as it was saved or loaded (replaced, resized or written
since: its device, inode, size and modification time are compared), every
:data:`MAX_SEGMENTS` checkpoints, and when the chain would hold more than
:data:`DEAD_FACTOR` times the rows it has live (rows rewritten since leave dead
copies behind).

A segment is shared by the checkpoints that link it: damage that leaves its
file's times alone (a disk's own) shows in each of them (the checksums catch
it at load, and the run starts over from the last checkpoint without that
segment, or from round 1). A full rewrite ends the sharing, at least every
:data:`MAX_SEGMENTS` checkpoints.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedforge.core.errors import StoreError
from fedforge.store.client_state import ClientStateStore, load_rows, save_rows

MAX_SEGMENTS = 16
DEAD_FACTOR = 2


@dataclass(frozen=True)
class Segment:
    """One file of a table's chain: its name in the checkpoint, the rows it holds
    (increasing client ids), and its size and sha256."""

    file: str
    ids: list[int]
    bytes: int
    sha256: str


Stamp = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns of a segment


@dataclass(frozen=True)
class Chain:
    """A table's segments in one checkpoint, and how many checkpoints have linked
    its oldest one since it was written in full (``age``)."""

    segments: list[Segment]
    age: int = 0


@dataclass(frozen=True)
class _Saved:
    source: Path  # the checkpoint directory the chain was saved in or loaded from
    chain: Chain
    stamps: dict[str, Stamp]  # each segment's file as it was then


# The chain each table's rows were last checkpointed as, in this process.
_CHAINS: weakref.WeakKeyDictionary[ClientStateStore, _Saved] = weakref.WeakKeyDictionary()


def segment_file(table_file: str, next_round: int) -> str:
    """``client_state.control.bin`` written at round 12: ``client_state.control.r000012.bin``."""
    return f"{table_file.removesuffix('.bin')}.r{next_round:06d}.bin"


def _stamp(path: Path) -> Stamp:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def write_table(
    table: ClientStateStore, table_file: str, directory: Path, next_round: int
) -> Chain:
    """The chain of ``table`` in the checkpoint being written in ``directory``
    (a temporary directory beside the checkpoints): the previous checkpoint's
    segments linked in and one new segment of the changed rows, or one segment of
    every written row."""
    new = segment_file(table_file, next_round)
    previous = _linked(table, directory, new)
    if previous is None:
        kept, ids, age = [], table.written(), 0
    else:
        kept, ids, age = previous.segments, table.changed() or [], previous.age + 1
    if not ids:
        return Chain(kept, age)
    ids, digest = save_rows(table, directory / new, ids)
    return Chain([*kept, Segment(new, ids, (directory / new).stat().st_size, digest)], age)


def _linked(table: ClientStateStore, directory: Path, new: str) -> Chain | None:
    """The previous chain, its segments hard-linked into ``directory``; None when
    the table is to be written in full instead."""
    saved, changed = _CHAINS.get(table), table.changed()
    if saved is None or changed is None:
        return None
    if saved.source.parent != directory.parent.resolve():  # another run's checkpoints
        return None
    chain = saved.chain
    held = sum(len(s.ids) for s in chain.segments) + len(changed)
    if chain.age + 1 >= MAX_SEGMENTS or held > DEAD_FACTOR * max(len(table.written()), 1):
        return None
    if any(s.file == new for s in chain.segments):  # the same round checkpointed again
        return None
    sources = [saved.source / s.file for s in chain.segments]
    try:  # each file as it was saved or loaded: not replaced, resized or written since
        if any(_stamp(f) != saved.stamps.get(f.name) for f in sources):
            return None
    except OSError:  # gone
        return None
    made: list[Path] = []
    try:
        for f in sources:
            os.link(f, directory / f.name)
            made.append(directory / f.name)
    except OSError:  # no hard links here: written in full, without the links made
        for link in made:
            link.unlink(missing_ok=True)
        return None
    return chain


def committed(table: ClientStateStore, directory: Path, chain: Chain) -> None:
    """``table`` is now checkpointed as ``chain`` in ``directory`` (saved, or
    loaded): the next checkpoint builds on it, if its files are still as now."""
    directory = directory.resolve()
    stamps = {s.file: _stamp(directory / s.file) for s in chain.segments}
    table.mark_checkpointed()
    _CHAINS[table] = _Saved(directory, chain, stamps)


def parse_chain(
    name: str, entry: Mapping[str, Any], files: Mapping[str, Any], legacy_file: str
) -> Chain:
    """The chain a checkpoint's ``meta.json`` lists for table ``name``, each
    segment with the size and sha256 its ``files`` give. ``legacy_file``: the one
    file of a format-1 checkpoint (``ids`` beside the table's shape)."""
    if not isinstance(entry.get("num_clients"), int):
        raise StoreError(f"its client state '{name}' lacks num_clients")
    if "segments" in entry:
        listed = entry["segments"]
        if not isinstance(listed, list) or not all(isinstance(s, dict) for s in listed):
            raise StoreError(f"its client state '{name}' has no list of segments")
        pairs = [(s.get("file"), s.get("ids")) for s in listed]
    else:
        pairs = [(legacy_file, entry.get("ids"))]
    out = []
    for file, ids in pairs:
        if not isinstance(file, str) or "/" in file or file.startswith("."):
            raise StoreError(f"its client state '{name}' names a segment file {file!r}")
        known = files.get(file)
        if not isinstance(known, dict):
            raise StoreError(f"{file}: no size and checksum in meta.json")
        out.append(Segment(file, _check_ids(name, ids, entry), known["bytes"], known["sha256"]))
    age = entry.get("age", max(len(out) - 1, 0))
    if not isinstance(age, int) or isinstance(age, bool) or age < 0:
        raise StoreError(f"its client state '{name}' has an age {age!r}; expected a count")
    return Chain(out, age)


def _check_ids(name: str, ids: Any, entry: Mapping[str, Any]) -> list[int]:
    """A segment's row ids as saved: strictly increasing client ids below the
    table's ``num_clients``."""
    num_clients = entry.get("num_clients")
    ok = isinstance(ids, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in ids)
    ok = ok and isinstance(num_clients, int) and all(0 <= c < num_clients for c in ids)
    if not ok or ids != sorted(set(ids)):
        raise StoreError(
            f"its client state '{name}' lists row ids that are not increasing client ids "
            f"in [0, {num_clients})"
        )
    return list(ids)


def read_table(table: ClientStateStore, directory: Path, chain: Chain) -> None:
    """Clear ``table`` and scatter its chain back, oldest segment first (files
    already verified)."""
    table.clear()
    for s in chain.segments:
        load_rows(table, directory / s.file, s.ids, clear=False)

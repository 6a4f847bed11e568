"""What the server knows of each client, as a selection policy reads it.

The server learns of a client only through the rounds that asked it: whether
its upload arrived, was taken or refused, and the training loss it reported
with a taken update. :class:`History` keeps that as columns: one numpy array
per field of :class:`ClientHistory`, indexed by client id, so its memory is a
few bytes per client of the population (no Python object per client).
:meth:`History.view` hands a policy a read-only :class:`ClientHistories`: the
:class:`ClientHistory` of any client made on access (with its example count
``n_k``), and :meth:`ClientHistories.column` a whole field as an array, for a
policy that scans the population. None is a sentinel in the arrays: -1
(:data:`NEVER`) in a round column, NaN in a seconds or loss column (a stored
loss or duration is always finite). The columns are plain JSON in every
checkpoint (``LoopState.selection``), so a resumed run's policy sees what an
uninterrupted run's saw; a simulation and a deployment fill them from the same
round phases, so both see the same.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ClientHistory:
    """One client as the server knows it before a round. Rounds are 0-based;
    None: never."""

    client_id: int
    num_examples: int  # n_k: the partition's count (a deployment: what it declared)
    asked: int = 0  # upload rounds whose cohort held it
    last_asked: int | None = None  # the last of them (an upload period's first round)
    used: int = 0  # rounds whose model took its update
    last_used: int | None = None
    # the training loss it reported with its last taken update (None where never
    # taken, or where the run's privacy hides losses)
    last_loss: float | None = None
    refused: int = 0  # its uploads the server refused (robust gates, bad messages)
    dropped: int = 0  # rounds it was asked and no upload of it arrived
    # seconds its last arrived upload took from the round's start (download, local
    # work, upload): the virtual clock's in a simulation, measured in a deployment;
    # None where never measured
    last_duration_s: float | None = None
    first_asked: int | None = None  # the first upload round whose cohort held it


# the stored columns (the counters; the id is the index, n_k is the run's)
_COLUMNS = tuple(f.name for f in fields(ClientHistory))[2:]
NEVER = -1  # a round column's None
_COUNTS = frozenset({"asked", "used", "refused", "dropped"})  # int32, 0 when never
_ROUNDS = frozenset({"last_asked", "last_used", "first_asked"})  # int32, NEVER for None
_FLOATS = frozenset({"last_loss", "last_duration_s"})  # float64, NaN for None
_MISSING: dict[str, int | float] = {
    k: math.nan if k in _FLOATS else NEVER if k in _ROUNDS else 0 for k in _COLUMNS
}
_DTYPE = {k: np.float64 if k in _FLOATS else np.int32 for k in _COLUMNS}


def _ids(values: Iterable[Any]) -> np.ndarray:
    """Client ids as an int64 array, each at least 0."""
    ids = np.array([int(c) for c in values], dtype=np.int64)
    if len(ids) and int(ids.min()) < 0:
        raise ValueError(f"client id {int(ids.min())} is negative; ids are 0 .. N-1")
    return ids


class ClientHistories(Mapping[int, ClientHistory]):
    """Every client's :class:`ClientHistory` by id (0 .. N-1), made on access."""

    def __init__(self, history: History, sizes: Sequence[int] | np.ndarray) -> None:
        self._history, self._sizes = history, sizes

    def __getitem__(self, client_id: int) -> ClientHistory:
        if not 0 <= client_id < len(self._sizes):
            raise KeyError(client_id)
        row = self._history.row(client_id)
        return ClientHistory(client_id, int(self._sizes[client_id]), **row)

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._sizes)))

    def __len__(self) -> int:
        return len(self._sizes)

    def column(self, name: str) -> np.ndarray:
        """One field of every client, a new array indexed by id (length N):
        ``num_examples`` (int64), a counter (int32, 0: never), a round (int32,
        :data:`NEVER` for None) or ``last_loss``/``last_duration_s`` (float64,
        NaN for None)."""
        if name == "num_examples":
            return np.asarray(self._sizes, dtype=np.int64).reshape(len(self._sizes))
        return self._history.column(name, len(self._sizes))


class History:
    """The columns behind :class:`ClientHistories`, updated after each upload
    round; they grow to the largest id seen. ``rows``: a starting state as
    :attr:`rows` gives it."""

    def __init__(self, rows: Mapping[int, Mapping[str, Any]] | None = None) -> None:
        self._cols = {k: np.full(0, _MISSING[k], _DTYPE[k]) for k in _COLUMNS}
        rows = rows or {}
        if rows:
            self._hold(max(int(c) for c in rows))
        for c, row in rows.items():
            for k, v in row.items():
                if k not in self._cols:
                    raise ValueError(f"unknown history field {k!r}; known: {', '.join(_COLUMNS)}")
                self._cols[k][int(c)] = _MISSING[k] if v is None else v

    def view(self, sizes: Sequence[int] | np.ndarray) -> ClientHistories:
        return ClientHistories(self, sizes)

    def _hold(self, top: int) -> None:
        """Room for ids up to ``top`` (grown by an eighth at least: few copies)."""
        held = len(self._cols["asked"])
        if top < held:
            return
        room = max(top + 1, held + held // 8)
        for k, a in self._cols.items():
            grown = np.full(room, _MISSING[k], _DTYPE[k])
            grown[:held] = a
            self._cols[k] = grown

    def row(self, client_id: int) -> dict[str, Any]:
        """What is known of ``client_id``: its fields other than 0 or None."""
        if client_id >= len(self._cols["asked"]):
            return {}
        row = {}
        for k, a in self._cols.items():
            v = a.item(client_id)  # a Python int or float
            if not math.isnan(v) if k in _FLOATS else v != 0 if k in _COUNTS else v != NEVER:
                row[k] = v
        return row

    @property
    def rows(self) -> dict[int, dict[str, Any]]:
        """Each known client's :meth:`row` by id, made on access (for reading)."""
        return {c: self.row(c) for c in self._known().tolist()}

    def column(self, name: str, num_clients: int) -> np.ndarray:
        """Field ``name`` of clients 0 .. ``num_clients`` - 1, a new array
        (:meth:`ClientHistories.column`)."""
        if name not in self._cols:
            raise KeyError(f"unknown history column {name!r}; known: {', '.join(_COLUMNS)}")
        stored = self._cols[name]
        out = np.full(num_clients, _MISSING[name], _DTYPE[name])
        kept = min(num_clients, len(stored))
        out[:kept] = stored[:kept]
        return out

    def _known(self) -> np.ndarray:
        """The ids of which something is known, ascending."""
        known = np.zeros(len(self._cols["asked"]), dtype=bool)
        for k, a in self._cols.items():
            known |= ~np.isnan(a) if k in _FLOATS else a != _MISSING[k]
        return np.flatnonzero(known)

    def round_done(
        self,
        start: int,
        round_idx: int,
        asked: Iterable[int],
        arrived: Iterable[int],
        losses: Mapping[int, float],
        refused: Iterable[int],
        durations: Mapping[int, float] | None = None,
    ) -> None:
        """An upload round's outcome: its cohort ``asked`` (drawn at the period's
        round ``start``), the uploads that ``arrived``, each taken update's
        reported loss (NaN: hidden), the clients whose uploads were refused, and
        the seconds each arrived upload took (where the round measured them)."""
        durations = durations or {}
        cohort, came = _ids(asked), _ids(arrived)
        taken, no = _ids(losses), _ids(refused)
        timed = _ids(durations)
        loss = np.array([float(x) for x in losses.values()], dtype=np.float64)
        seconds = np.array([float(x) for x in durations.values()], dtype=np.float64)
        every = np.concatenate([cohort, taken, no, timed])
        if len(every):
            self._hold(int(every.max()))
        c = self._cols
        np.add.at(c["asked"], cohort, 1)
        c["last_asked"][cohort] = start
        first = c["first_asked"]
        first[cohort[first[cohort] == NEVER]] = start
        np.add.at(c["dropped"], cohort[~np.isin(cohort, came)], 1)
        np.add.at(c["used"], taken, 1)
        c["last_used"][taken] = round_idx
        shown = np.isfinite(loss)
        c["last_loss"][taken[shown]] = loss[shown]
        np.add.at(c["refused"], no, 1)
        shown = np.isfinite(seconds)
        c["last_duration_s"][timed[shown]] = seconds[shown]

    def state_dict(self) -> list[list[Any]]:
        """The known clients' rows as plain JSON data, by id: ``[id, *fields]``
        in :class:`ClientHistory`'s order, None for a field never set (a counter
        at 0 included); finite floats round-trip exactly."""
        ids = self._known()
        columns: list[list[Any]] = [ids.tolist()]
        for k, a in self._cols.items():
            values = a[ids].tolist()
            if k in _FLOATS:
                columns.append([None if math.isnan(v) else v for v in values])
            else:
                columns.append([None if v == _MISSING[k] else v for v in values])
        return [list(row) for row in zip(*columns, strict=True)]

    @classmethod
    def from_state(cls, stored: Any) -> History:
        """The history a checkpoint holds (none: a run checkpointed before any)."""
        history = cls()
        entries = list(stored or [])
        if not entries:
            return history
        ids = _ids(entry[0] for entry in entries)
        history._hold(int(ids.max()))
        for i, (k, a) in enumerate(history._cols.items(), start=1):
            # a checkpoint written before a column existed holds fewer: None
            values = [entry[i] if len(entry) > i else None for entry in entries]
            a[ids] = [_MISSING[k] if v is None else v for v in values]
        return history

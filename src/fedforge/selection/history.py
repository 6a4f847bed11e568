"""What the server knows of each client, as a selection policy reads it.

The server learns of a client only through the rounds that asked it: whether
its upload arrived, was taken or refused, and the training loss it reported
with a taken update. :class:`History` keeps that, one row per client ever
asked; :meth:`History.view` hands a policy a read-only :class:`ClientHistories`
(the row of every client, with its example count ``n_k``). The rows are plain
JSON in every checkpoint (``LoopState.selection``), so a resumed run's policy
sees what an uninterrupted run's saw; a simulation and a deployment fill them
from the same round phases, so both see the same.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any


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


# the stored columns of a row (the counters; the id is the row's key, n_k is the run's)
_COLUMNS = tuple(f.name for f in fields(ClientHistory))[2:]


class ClientHistories(Mapping[int, ClientHistory]):
    """Every client's :class:`ClientHistory` by id (0 .. N-1), made on access."""

    def __init__(self, rows: Mapping[int, dict[str, Any]], sizes: Sequence[int]) -> None:
        self._rows, self._sizes = rows, sizes

    def __getitem__(self, client_id: int) -> ClientHistory:
        if not 0 <= client_id < len(self._sizes):
            raise KeyError(client_id)
        row = self._rows.get(client_id, {})
        return ClientHistory(client_id, int(self._sizes[client_id]), **row)

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._sizes)))

    def __len__(self) -> int:
        return len(self._sizes)


class History:
    """The rows behind :class:`ClientHistories`, updated after each upload round."""

    def __init__(self, rows: dict[int, dict[str, Any]] | None = None) -> None:
        self.rows: dict[int, dict[str, Any]] = rows if rows is not None else {}

    def view(self, sizes: Sequence[int]) -> ClientHistories:
        return ClientHistories(self.rows, sizes)

    def _row(self, client_id: int) -> dict[str, Any]:
        return self.rows.setdefault(client_id, {})

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
        came = set(arrived)
        for c in asked:
            row = self._row(c)
            row["asked"] = row.get("asked", 0) + 1
            row["last_asked"] = start
            row.setdefault("first_asked", start)
            if c not in came:
                row["dropped"] = row.get("dropped", 0) + 1
        for c, loss in losses.items():
            row = self._row(c)
            row["used"] = row.get("used", 0) + 1
            row["last_used"] = round_idx
            if math.isfinite(loss):
                row["last_loss"] = float(loss)
        for c in refused:
            row = self._row(c)
            row["refused"] = row.get("refused", 0) + 1
        for c, seconds in (durations or {}).items():
            if math.isfinite(seconds):
                self._row(c)["last_duration_s"] = float(seconds)

    def state_dict(self) -> list[list[Any]]:
        """The rows as plain JSON data (finite floats round-trip exactly), by id."""
        return [[c, *(row.get(k) for k in _COLUMNS)] for c, row in sorted(self.rows.items())]

    @classmethod
    def from_state(cls, stored: Any) -> History:
        """The history a checkpoint holds (none: a run checkpointed before any)."""
        rows: dict[int, dict[str, Any]] = {}
        for entry in stored or []:
            # a checkpoint written before a column existed holds fewer: None
            stored_values = [*entry[1:], *[None] * (len(_COLUMNS) - len(entry[1:]))]
            values = dict(zip(_COLUMNS, stored_values, strict=True))
            rows[int(entry[0])] = {k: v for k, v in values.items() if v is not None}
        return cls(rows)

"""Bases for an algorithm's client and server halves (``ClientTerms``,
``ServerTerms``: algorithms/local.py).

:class:`StatelessClientTerms` is the half of a method that keeps nothing per
client and only sends tensors beside its delta (FedNova's step counts, q-FedAvg's
h_k): a subclass writes ``end`` alone. :class:`PendingClientTable` is the half
of a method with one row of state per client (SCAFFOLD's c_k, FedDyn's grad_i):
a client's new row is held pending until the server says it used the client's
update, then stored; a refused update or a skipped round leaves the old row, so
the server's state (which saw only the used updates) and the clients' agree.
:class:`StatelessServerTerms` is the server half of a method that keeps no
server state and reads what the updates carry in its ``ServerStep`` alone
(q-FedAvg, FedExP); :func:`summed` adds one carried tensor over the used updates.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import torch

from fedforge.algorithms.local import ClientJob
from fedforge.core.params import all_finite
from fedforge.store.client_state import ClientStateStore


class StatelessClientTerms:
    """``ClientTerms`` of a method with no per-client state: ``begin`` adds nothing
    to the payload, nothing is pending or committed. Subclasses give ``end``: the
    tensors one client's update carries beside its delta (``[P]`` vectors or
    ``[1]`` scalars, named as ``ServerTerms.update_tensors`` names them)."""

    @property
    def tables(self) -> Mapping[str, ClientStateStore]:
        """Its per-client tables, saved by checkpoints: none (a new empty mapping
        each time: nothing written to it is kept)."""
        return {}

    def begin(
        self, client_ids: Sequence[int], start: torch.Tensor, extras: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        return {}

    def end(self, job: ClientJob) -> dict[str, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} must define end(job)")

    def commit(self, used: Collection[int]) -> None:
        pass

    def commit_used(self, used: Collection[int]) -> None:
        pass

    def pending(self) -> dict[int, torch.Tensor]:
        return {}

    def restore_pending(self, pending: Mapping[int, torch.Tensor]) -> None:
        pass


class PendingClientTable(StatelessClientTerms):
    """``ClientTerms`` with one row a client in ``store`` (saved by checkpoints as
    table ``name``). ``end`` computes a client's new row and passes it to
    :meth:`hold`; :meth:`commit` stores the held rows of the clients whose update
    the server used and forgets the others' (the simulator: one round at a
    time); :meth:`commit_used` stores the used ones' and keeps the others
    pending (a deployment's client, told of each round's use separately)."""

    def __init__(self, name: str, store: ClientStateStore) -> None:
        self.store = store
        self._tables = {name: store}
        self._pending: dict[int, torch.Tensor] = {}

    @property
    def tables(self) -> Mapping[str, ClientStateStore]:
        """Its one table, saved by checkpoints."""
        return self._tables

    def rows(self, client_ids: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """The stored rows of ``client_ids`` (``[len, P]``), in ``dtype``."""
        return self.store.gather(list(client_ids)).to(dtype)

    def hold(self, client_id: int, row: torch.Tensor) -> None:
        """Hold ``client_id``'s new row until commit; a non-finite row (a local run
        that blew up) is dropped, and the client keeps its old one: stored, it
        would poison every later round of that client."""
        if all_finite(row):
            self._pending[client_id] = row

    def pending(self) -> dict[int, torch.Tensor]:
        """The rows computed and not yet committed (a deployment's client keeps
        them on disk until the server says whether it used them)."""
        return dict(self._pending)

    def restore_pending(self, pending: Mapping[int, torch.Tensor]) -> None:
        """Put back rows computed before a restart and not yet committed."""
        self._pending.update(pending)

    def commit_used(self, used: Collection[int]) -> None:
        """Store the held rows of ``used``; the others' stay pending."""
        later = {c: p for c, p in self._pending.items() if c not in used}
        self.commit(used)
        self._pending.update(later)

    def commit(self, used: Collection[int]) -> None:
        """Store the held rows of ``used``; forget the others'."""
        ids = sorted(c for c in self._pending if c in used)
        if ids:
            self.store.scatter(ids, torch.stack([self._pending[c] for c in ids]))
        self._pending.clear()


class StatelessServerTerms:
    """``ServerTerms`` with no server state and nothing in the payload; the used
    updates carry ``update_tensors`` (read by the algorithm's ``ServerStep``)."""

    def __init__(self, *update_tensors: str) -> None:
        self.update_tensors = tuple(update_tensors)

    def initial_state(self, size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {}

    def payload(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {}

    def admit(
        self, delta: torch.Tensor, extras: Mapping[str, torch.Tensor], num_examples: int
    ) -> dict[str, torch.Tensor]:
        """The update's tensors as they came (override to check or recompute them:
        ``ServerTerms``)."""
        return dict(extras)

    def moved(
        self,
        state: Mapping[str, torch.Tensor],
        extras: Sequence[Mapping[str, torch.Tensor]],
        num_clients: int,
    ) -> dict[str, torch.Tensor]:
        return dict(state)


def summed(extras: Sequence[Mapping[str, torch.Tensor]], name: str) -> torch.Tensor:
    """The sum of tensor ``name`` over the used updates' extras (at least one)."""
    return torch.stack([e[name] for e in extras]).sum(dim=0)

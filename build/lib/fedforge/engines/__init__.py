"""Engines decide where client work runs, never what it computes (DESIGN idea 4)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from fedforge.client.runtime import ClientTask, ClientUpload


class Engine(Protocol):
    """Runs a cohort's tasks against one payload and yields their uploads.

    A deployment's engine (transport/remote.py) may also have ``begin_round(r,
    params)`` (told the round and its model before the protocol phases; returns
    rows for the store), ``bind_store(store)`` (the run's store), ``end_round(r, used)`` (told
    whose updates the round used: they keep the state computed with them) and
    ``over_selection`` (the fraction more clients the round samples; it closes
    at the needed count) and ``declared_sizes()`` (each client's example count as
    it declared it when it joined: the sizes when the clients bring their own
    data)."""

    name: str

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]: ...

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        """An extra protocol phase (secure aggregation): one message to each
        addressed client, their replies (function calls in simulation)."""
        ...


def close_engine(engine: object) -> None:
    """Release what an engine holds (worker processes); engines without any
    resources need no ``close``."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


__all__ = ["Engine", "close_engine"]

"""Engines decide where client work runs, never what it computes (DESIGN idea 4).

:class:`Engine` states everything the round asks of an engine. A simulation
engine (serial, vectorised, worker processes) has only ``run_cohort`` and
``run_phase`` of its own and takes the rest from :class:`SimulationEngine`,
whose defaults say "every client is here, nothing else to do"; the deployment's
network engine (transport/remote.py) fills them in."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.engines.partial import PartialSum, Summing

if TYPE_CHECKING:
    from fedforge.store import RunStore

Rows = dict[str, list[tuple[Any, ...]]]  # rows of the run store's per-round tables, by table


class Engine(Protocol):
    """Runs a cohort's tasks against one payload and yields their uploads, and
    answers the round's questions about where its clients are."""

    name: str
    # the fraction more clients a round samples than it needs; it closes at the
    # needed count (a deployment: some clients never answer)
    over_selection: float

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        """Each task's upload, in the order they finish."""
        ...

    def run_summed(
        self, tasks: Sequence[ClientTask], payload: bytes, summing: Summing
    ) -> Iterator[PartialSum] | None:
        """The tasks' uploads judged and summed where they are trained, one share
        a worker (engines/partial.py); None: this engine sends each upload."""
        ...

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        """An extra protocol phase (secure aggregation): one message to each
        addressed client, their replies (function calls in simulation)."""
        ...

    def sampling_pool(self, round_idx: int, need: int) -> list[int] | None:
        """The clients round ``round_idx`` may sample (None: every client), waiting a
        while for ``need`` of them."""
        ...

    def sent_down(self) -> tuple[int, int] | None:
        """The bytes down since the last call as they crossed the wire and how many
        model downloads they hold (None: count the payload once per cohort client)."""
        ...

    def declared_sizes(self) -> list[int] | None:
        """Each client's example count as it declared it when it joined (None: the
        partition's sizes hold)."""
        ...

    def bind_store(self, store: RunStore) -> None:
        """The run's store (a deployment reads the last round's commits there after
        a resume, and names its folder in its live state)."""
        ...

    def begin_round(self, round_idx: int) -> None:
        """Told an upload round begins, before its clients are asked (a deployment
        posts the last upload round's commits)."""
        ...

    def end_round(self, round_idx: int, used: Sequence[int]) -> Rows:
        """Told whose updates the round used (a deployment's clients keep the state
        computed with them); rows for the run store (a deployment's measured
        client times)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (worker processes)."""
        ...


class SimulationEngine:
    """The defaults of an engine whose clients are simulated in this machine: all
    of them can be sampled, the payload is counted once per cohort client, the
    partition says each client's size, and nothing is told around a round."""

    name = "simulation"
    over_selection = 0.0

    def sampling_pool(self, round_idx: int, need: int) -> list[int] | None:
        return None

    def run_summed(
        self, tasks: Sequence[ClientTask], payload: bytes, summing: Summing
    ) -> Iterator[PartialSum] | None:
        return None

    def sent_down(self) -> tuple[int, int] | None:
        return None

    def declared_sizes(self) -> list[int] | None:
        return None

    def bind_store(self, store: RunStore) -> None:
        return None

    def begin_round(self, round_idx: int) -> None:
        return None

    def end_round(self, round_idx: int, used: Sequence[int]) -> Rows:
        return {}

    def close(self) -> None:
        return None


def close_engine(engine: Engine) -> None:
    """Release what an engine holds (worker processes)."""
    engine.close()


__all__ = ["Engine", "SimulationEngine", "close_engine"]

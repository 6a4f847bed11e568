"""A Ray worker of ``engine: ray``: one actor process holding the client runtime
(the model, the algorithm, every client's data: placed once, when the actor
starts) and the per-client rows of the clients it owns (error-feedback
residuals, SCAFFOLD's controls, FedBN's batch norm), which never leave it but
through the driver's checkpoint reads (engines/ray_tables.py).

Each call trains tasks exactly as the serial engine does in the driver (the
same ``ClientRuntime.run``; a task's randomness comes from its seed), so what a
worker computes equals what the driver would. A client's exception is raised
again as :class:`ClientFailed`, naming the client and the round.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fedforge.client.runtime import ClientRuntime, ClientTask
from fedforge.core.device import HOST, module_device, resolve_device
from fedforge.core.errors import ConfigError, EngineError
from fedforge.core.precision import precision_note
from fedforge.engines.partial import PartialSum, Summing
from fedforge.engines.threads import set_threads
from fedforge.store.client_state import ClientStateStore


class ClientFailed(Exception):
    """A client's training raised: the client, the round and the error, in one line."""

    def __init__(self, client_id: int, round_idx: int, error: str) -> None:
        super().__init__(client_id, round_idx, error)
        self.client_id, self.round_idx, self.error = client_id, round_idx, error

    def __str__(self) -> str:
        return f"client {self.client_id} failed in round {self.round_idx + 1}: {self.error}"


class ClientWorker:
    """The actor's state and the calls the driver makes (``ray.remote`` wraps it)."""

    def __init__(self, bundle: list[Any], threads: int, device: str) -> None:
        import ray  # in the actor's process, which Ray started

        # the object-store reference travels inside a list: the actor reads it at
        # each start (restarts too), and the driver keeps it alive
        loaded: tuple[ClientRuntime, dict[str, ClientStateStore]] = ray.get(bundle[0])
        runtime, tables = loaded
        set_threads(threads)
        self.runtime, self.tables = runtime, tables
        self.kept: tuple[int, PartialSum] | None = None  # (round, share) awaiting settle
        self.settled: tuple[int, PartialSum] | None = None  # (round, share) to be taken
        # the run's device, resolved where the worker runs (Ray shows it the GPUs
        # it reserved): each task trains there. A device this machine lacks is
        # said at the worker's first call, as one line (an actor whose start
        # raised would only read as a lost worker)
        self.refused: str | None = None
        try:
            runtime.model.to(resolve_device(device))
        except Exception as exc:  # no such device here, or it is busy or full
            why = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
            self.refused = f"the Ray worker on {socket.gethostname()} cannot train there: {why}"

    def pid(self) -> int:
        self._check()
        return os.getpid()

    def _check(self) -> None:
        if self.refused is not None:
            raise EngineError(self.refused)

    def device(self) -> str:
        """Where this worker's tasks train."""
        return str(module_device(self.runtime.model))

    def precision_note(self, precision: str) -> str | None:
        """The run's precision as this worker computes it: a note where bf16 is
        emulated (a CPU without native bf16); None on a GPU."""
        if module_device(self.runtime.model) != HOST:
            return None
        return precision_note(precision)

    def kept_round(self) -> int | None:
        """The round whose uploads this worker keeps awaiting a settle, if any."""
        return None if self.kept is None else self.kept[0]

    def forget(self) -> None:
        """Drop the uploads kept for a settle and a share not taken (the round is
        over, or abandoned)."""
        self.kept = self.settled = None

    def run(self, payload: bytes, tasks: Sequence[ClientTask]) -> list[tuple[int, bytes, float]]:
        """Each task's encoded update and seconds, in task order."""
        out = []
        for task in tasks:
            t0 = time.perf_counter()
            data = self._train(task, payload)
            out.append((task.client_id, data, time.perf_counter() - t0))
        return out

    def run_summed(
        self, payload: bytes, tasks: Sequence[ClientTask], summing: Summing
    ) -> PartialSum:
        """The tasks' updates checked and summed here (engines/partial.py): the
        driver receives one weighted sum, whatever the number of clients."""
        self.kept = None  # an earlier round's, were its settle never to come
        part = summing.start(self.runtime.codec)
        for task in tasks:
            t0 = time.perf_counter()
            data = self._train(task, payload)
            part.add(task.client_id, data, time.perf_counter() - t0)
        return part

    def run_kept(self, payload: bytes, tasks: Sequence[ClientTask], summing: Summing) -> Any:
        """A round that waits, first pass: the tasks' updates checked and kept
        here; what the driver needs to settle the round (their norms)."""
        share = self.run_summed(payload, tasks, summing)
        self.kept = (tasks[0].round_idx, share)
        return share.report()

    def run_settled(
        self, payload: bytes, tasks: Sequence[ClientTask], summing: Summing, settled: Summing
    ) -> bool:
        """Second pass: the kept updates summed under the settled round, held here
        until taken (``take_settled``), so the driver learns that every worker has
        summed before it takes any share. The uploads stay kept until ``forget``
        (the driver settles again without a worker lost in this pass). A worker
        that keeps none of this round (it replaced a lost one) trains them again
        (a task's randomness is its seed's: the same updates)."""
        round_idx = tasks[0].round_idx
        if self.kept is None or self.kept[0] != round_idx:
            self.run_kept(payload, tasks, summing)
        assert self.kept is not None
        self.settled = (round_idx, self.kept[1].settle(settled))
        return True

    def take_settled(
        self, payload: bytes, tasks: Sequence[ClientTask], summing: Summing, settled: Summing
    ) -> PartialSum:
        """The share ``run_settled`` summed; one that has none (it replaced a lost
        worker) sums it first."""
        if self.settled is None or self.settled[0] != tasks[0].round_idx:
            self.run_settled(payload, tasks, summing, settled)
        assert self.settled is not None
        share, self.settled = self.settled[1], None
        return share

    def _train(self, task: ClientTask, payload: bytes) -> bytes:
        self._check()
        try:
            return self.runtime.run(task, payload)
        except Exception as exc:  # raised to the driver as one line naming the client
            raise ClientFailed(
                task.client_id, task.round_idx, f"{type(exc).__name__}: {exc}"
            ) from None

    def phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        return self.runtime.run_phase(phase, messages)

    def commit(self, used: Sequence[int]) -> None:
        """Keep the state computed this round for the clients whose updates the
        model took (SCAFFOLD's c_k+), forget the others' (the serial engine's
        ``client_state`` hook, done where the rows are)."""
        terms = self.runtime.algorithm.client
        if terms is not None:
            terms.commit(set(used))

    def table(self, name: str, call: str, *args: Any) -> Any:
        """A call of the table ``name`` (``gather``, ``scatter``, ``written``, ...)."""
        return getattr(self.tables[name], call)(*args)

"""``engine: ray``: the cohort trained by Ray actors, on this machine or a cluster.

The driver (the run's process) connects to a cluster (``ray.address``, else
``RAY_ADDRESS``) or starts a local one, and starts ``ray.workers`` actors
(engines/ray_worker.py), each reserving ``ray.num_cpus`` CPUs and
``ray.num_gpus`` GPUs. The client runtime (model, algorithm, every client's data)
goes into the object store once and each actor loads it when it starts: data
is placed on the workers once, never shipped per round. Each round's payload is
put into the object store once and read by every worker.

Client c is trained by worker ``c % workers`` every round, so the per-client
rows of a stateful run (error feedback, SCAFFOLD's controls, FedBN's batch
norm) live in that worker: the driver's tables are moved there
(store/relocated.py, engines/ray_tables.py) and reached through them by
checkpoints, evaluation and resume. After each round the workers keep the state
computed for the clients whose updates the model took (``end_round``).

Uploads come back to the driver in cohort order, each client a call, at most a
few calls a worker in flight (the driver holds that many uploads), so the
streaming sum is the serial engine's, bit for bit. Where the round's aggregate
is a plain weighted mean, each worker instead checks and sums its clients'
updates (engines/partial.py: ``run_summed``) and the driver receives one sum a
worker, in worker order: equal to the serial engine's to rounding (1e-9 in
float64), and the same from run to run. A round that judges its uploads by the
median of their own norms (a run's first) is summed in two passes: the workers
keep their uploads and report their norms, then sum under the settled bound.

A lost worker (its process killed, its node gone): under ``on_worker_failure:
retry`` the engine starts a new worker in its place (at most
``ray.max_restarts`` over the run) and the lost calls run again there, giving
the same uploads (a task's randomness is its seed's); under ``dropout`` its
clients of the round count as dropouts (and a new worker takes its place for
the next rounds). A worker holding per-client rows cannot be replaced (its
rows are gone): the round ends with an :class:`EngineError`, and the run
resumes from its last checkpoint, whose rows go to the new workers. A client's
exception ends the round as one line naming the client and the round.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fedforge.client.runtime import ClientRuntime, ClientTask, ClientUpload
from fedforge.core.errors import EngineError
from fedforge.core.registry import FILE_PLUGIN_PREFIX
from fedforge.engines import SimulationEngine
from fedforge.engines.partial import PartialSum, Summing
from fedforge.engines.ray_connect import check_resources, connect
from fedforge.engines.ray_tables import ShardedRows
from fedforge.engines.ray_worker import ClientFailed, ClientWorker
from fedforge.store.client_state import ClientStateStore
from fedforge.store.relocated import relocate

IN_FLIGHT = 4  # calls a worker has queued: uploads the driver may hold, per worker


@dataclass(frozen=True)
class RaySettings:
    """The ``ray:`` section as the engine needs it."""

    address: str | None
    workers: int
    num_cpus: float
    num_gpus: float
    on_worker_failure: str
    max_restarts: int
    aggregate_on_workers: bool
    device: str = "cpu"


def plugin_modules() -> list[ModuleType]:
    """The plugins imported from ``.py`` files (core/registry.py names them so)."""
    return [m for name, m in list(sys.modules.items()) if name.startswith(FILE_PLUGIN_PREFIX)]


def import_ray() -> Any:
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise EngineError(
            "engine: ray needs Ray: pip install 'fedforge[ray]' (or engine: serial)"
        ) from None
    return ray


class RayEngine(SimulationEngine):
    """The cohort's tasks run by Ray actors (see the module docstring)."""

    name = "ray"

    def __init__(
        self, runtime: ClientRuntime, tables: Mapping[str, ClientStateStore], settings: RaySettings
    ) -> None:
        self.settings = settings
        self.stateful = bool(tables)
        self.ray = ray = import_ray()
        self._started_ray = False
        if not ray.is_initialized():
            connect(ray, settings.address or os.environ.get("RAY_ADDRESS") or None)
            self._started_ray = True
        self._actors: list[Any] = []
        try:
            self._start(runtime, tables)
        except BaseException:  # nothing left behind: the workers, a cluster it started
            self.close()
            raise

    def _start(self, runtime: ClientRuntime, tables: Mapping[str, ClientStateStore]) -> None:
        ray, settings = self.ray, self.settings
        self.workers = self._count()
        check_resources(ray, self.workers, settings.num_cpus, settings.num_gpus)
        self.name = f"rayx{self.workers}"
        self.restarts = 0  # workers replaced so far (at most ray.max_restarts)
        # plugins loaded from .py files are modules no worker can import: their
        # classes and functions travel by value
        for module in plugin_modules():
            ray.cloudpickle.register_pickle_by_value(module)
        # the runtime and its (still empty) tables, pickled together: each actor's
        # runtime then writes the very tables the actor answers for
        self._bundle = ray.put((runtime, dict(tables)))
        self._actor = ray.remote(ClientWorker).options(
            num_cpus=settings.num_cpus, num_gpus=settings.num_gpus, max_restarts=0
        )
        self._actors = [self._start_worker() for _ in range(self.workers)]
        for name, table in tables.items():
            rows = ShardedRows(
                name,
                table.num_clients,
                table.size,
                table.dtype,
                self.workers,
                self._table_call,
                self._get,
            )
            relocate(table, rows)
        self._get([a.pid.remote() for a in self._actors])  # started, or the error now

    def _start_worker(self) -> Any:
        threads = max(1, int(self.settings.num_cpus))
        return self._actor.remote([self._bundle], threads, self.settings.device)

    def _count(self) -> int:
        """``ray.workers``, or as many as the cluster's CPUs (and GPUs) allow."""
        s = self.settings
        if s.workers:
            return s.workers
        have = self.ray.cluster_resources()
        fit = int(float(have.get("CPU", 1)) // s.num_cpus)
        if s.num_gpus > 0:  # as many as the GPUs allow too
            fit = min(fit, int(float(have.get("GPU", 0)) // s.num_gpus))
        return max(1, fit)

    def owner(self, client_id: int) -> int:
        return client_id % self.workers

    def _table_call(self, worker: int, name: str, method: str, args: tuple[Any, ...]) -> Any:
        return self._actors[worker].table.remote(name, method, *args)

    def _get(self, futures: list[Any]) -> list[Any]:
        """The futures' values; a client's or a worker's failure as one line."""
        try:
            return list(self.ray.get(futures))
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, ClientFailed | EngineError):
                raise EngineError(str(cause)) from None
            raise cause from None
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.ObjectLostError) as exc:
            raise EngineError(self._lost(exc)) from None  # the worker, or its node, is gone

    def _lost(self, exc: Exception) -> str:
        why = str(exc).splitlines()[0][:200]
        held = "it held its clients' per-client state; " if self.stateful else ""
        return (
            f"a Ray worker was lost ({why}); {held}the round is lost, resume the run from "
            "its last checkpoint"
        )

    def _call(self, worker: int, method: str, *args: Any) -> _Call:
        handle = self._actors[worker]
        return _Call(worker, handle, getattr(handle, method).remote(*args), method, args)

    def _result(self, call: _Call, may_drop: bool = True) -> Any | None:
        """``call``'s value. Its worker lost: under ``retry`` (or where the call
        may not drop its clients) the worker is replaced (once, whichever of its
        calls learns it first) and the call made again there; under ``dropout``
        None (its clients are this round's dropouts); a worker with per-client
        state, or past ``ray.max_restarts``: EngineError."""
        while True:
            try:
                return self._get([call.future])[0]
            except EngineError:
                if not self._replace(call):
                    raise
            if may_drop and self.settings.on_worker_failure == "dropout":
                print(
                    f"fedforge: Ray worker {call.worker} was lost; its clients of this round "
                    "count as dropouts",
                    file=sys.stderr,
                )
                return None
            call = self._call(call.worker, call.method, *call.args)

    def _replace(self, call: _Call) -> bool:
        """Replace ``call``'s lost worker (unless another of its calls did);
        whether the call may go on (False: the loss ends the round)."""
        try:
            self.ray.get(call.future)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.ObjectLostError):
            pass
        except Exception:  # not a lost worker: the client's own error
            return False
        if self.stateful:
            return False
        if self._actors[call.worker] is call.handle:
            if self.restarts >= self.settings.max_restarts:
                return False
            self.restarts += 1
            with contextlib.suppress(Exception):  # a worker only "unavailable" could come back
                self.ray.kill(call.handle)
            self._actors[call.worker] = self._start_worker()
        return True

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        if not tasks:
            return
        ref = self.ray.put(payload)  # once a round: every worker reads it from the store
        jobs = iter(tasks)
        pending: deque[_Call] = deque()

        def submit() -> None:
            task = next(jobs, None)
            if task is not None:
                pending.append(self._call(self.owner(task.client_id), "run", ref, [task]))

        for _ in range(IN_FLIGHT * self.workers):
            submit()
        try:
            while pending:
                call = pending.popleft()
                submit()
                for client_id, data, seconds in self._result(call) or ():
                    yield ClientUpload(client_id, data, seconds)
        finally:  # the driver stopped reading: drop the rest
            _cancel(self.ray, [c.future for c in pending])

    def run_summed(
        self, tasks: Sequence[ClientTask], payload: bytes, summing: Summing
    ) -> Iterator[PartialSum] | None:
        """Each worker's clients judged and summed where they trained: one share
        a worker, in worker order (None: this engine is told to send each upload)."""
        if not self.settings.aggregate_on_workers:
            return None
        return self._summed(tasks, payload, summing)

    def _summed(
        self, tasks: Sequence[ClientTask], payload: bytes, summing: Summing
    ) -> Iterator[PartialSum]:
        ref = self.ray.put(payload)
        shares: dict[int, list[ClientTask]] = {}
        for task in tasks:
            shares.setdefault(self.owner(task.client_id), []).append(task)
        if summing.waits:
            yield from self._two_passes(ref, shares, summing)
            return
        calls: list[_Call] = []
        try:
            calls = [
                self._call(w, "run_summed", ref, s, summing) for w, s in sorted(shares.items())
            ]
            for call in calls:
                share = self._result(call)
                if share is not None:
                    yield share
        finally:
            _cancel(self.ray, [c.future for c in calls])

    def _two_passes(
        self, ref: Any, shares: Mapping[int, list[ClientTask]], summing: Summing
    ) -> Iterator[PartialSum]:
        """A round that waits: each worker keeps its uploads and reports their
        norms, the round is settled from the reports of the workers still there,
        and each sums its kept uploads under it and holds the sum. A worker lost
        in that second pass (under ``dropout``) takes its clients out of the
        round, reports included: the round is settled again without them and
        the others sum again (they still keep their uploads). Once every worker
        holds its sum, the sums are taken one at a time (the driver holds one);
        a worker lost then is replaced whatever ``on_worker_failure`` says (its
        norms are in the bound: its clients are trained again). The workers
        drop what they keep at the end, the round completed or abandoned."""
        calls: list[_Call] = []
        try:
            calls = [self._call(w, "run_kept", ref, s, summing) for w, s in sorted(shares.items())]
            reports = {c.worker: self._result(c) for c in calls}
            while live := [w for w, r in reports.items() if r is not None]:
                settled = summing.settle([reports[w] for w in live])
                calls = [
                    self._call(w, "run_settled", ref, shares[w], summing, settled) for w in live
                ]
                done = {c.worker: self._result(c) for c in calls}
                if all(done.values()):
                    break
                reports.update((w, None) for w, d in done.items() if not d)
            else:  # every worker lost: the whole cohort dropped out
                return
            for w in live:  # asked one at a time: the driver holds one share
                calls = [self._call(w, "take_settled", ref, shares[w], summing, settled)]
                share = self._result(calls.pop(), may_drop=False)
                assert share is not None  # replaced, or the round ends
                yield share
                del share
        finally:
            _cancel(self.ray, [c.future for c in calls])
            for actor in self._actors:  # after the round's calls: Ray keeps a caller's order
                with contextlib.suppress(Exception):
                    actor.forget.remote()

    def precision_note(self, precision: str) -> str | None:
        """Where the workers emulate bf16 (CPUs without it), one line saying on how many."""
        said = self._get([a.precision_note.remote(precision) for a in self._actors])
        notes = [n for n in said if n]
        if not notes:
            return None
        return f"{notes[0]} ({len(notes)} of {len(self._actors)} Ray workers)"

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        by_worker: dict[int, dict[int, bytes]] = {}
        for c, m in messages.items():
            by_worker.setdefault(self.owner(c), {})[c] = m
        futures = [self._actors[w].phase.remote(phase, part) for w, part in by_worker.items()]
        replies: dict[int, bytes] = {}
        for part in self._get(futures):
            replies.update(part)
        return replies

    def end_round(self, round_idx: int, used: Sequence[int]) -> dict[str, list[tuple[Any, ...]]]:
        if self.stateful:
            self._get([a.commit.remote(list(used)) for a in self._actors])
        return {}

    def worker_pids(self) -> list[int]:
        """The actors' process ids (the tests kill one)."""
        return [int(p) for p in self._get([a.pid.remote() for a in self._actors])]

    def close(self) -> None:
        """End the actors; a cluster this engine started is shut down."""
        actors, self._actors = self._actors, []
        for a in actors:
            with contextlib.suppress(Exception):  # already gone
                self.ray.kill(a)
        if self._started_ray and self.ray.is_initialized():
            self.ray.shutdown()
            self._started_ray = False


@dataclass(frozen=True)
class _Call:
    """A call made to a worker: where, to which actor, its future, what it asked."""

    worker: int
    handle: Any
    future: Any
    method: str
    args: tuple[Any, ...]


def _cancel(ray: Any, futures: list[Any]) -> None:
    """Cancel calls not yet run (a call already done or running is left be)."""
    for future in futures:
        with contextlib.suppress(Exception):  # finished already, or not cancellable
            ray.cancel(future)

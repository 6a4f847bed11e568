"""Worker processes: a cohort spread over several single-threaded processes.

On a CPU, small-batch client training uses one core badly when it is given
several threads (at B = 10 a second intra-op thread barely helps one client),
but independent clients are embarrassingly parallel: W processes of one thread
each, every one running the serial or the vectorised engine over its share of
the cohort, use W cores fully. This is the engine-level form of several
single-threaded workers, each over a chunk of clients.

What the workers compute is exactly what the inner engine computes in the
server process: the same runtime (forked, so it needs no pickling and no second
load of the data), the same derived generators, its share of the cores as torch
threads (one when there are as many workers as cores). With the serial
inner engine the uploads are bit-identical to the serial engine's in a
one-thread process (tests/test_pool_engine.py). Uploads come back in cohort
order, so streaming aggregation sums in the same order too.

Only a runtime that keeps nothing per client between rounds may be spread:
error-feedback residuals, SCAFFOLD's controls, FedBN's batch norm and secure
aggregation's keys would otherwise change in a worker and be lost (or never
reach the checkpoint). Nor may a runtime on a CUDA device: CUDA does not
survive the fork. ``engine_choice.make_engine`` checks; the run then falls
back to the inner engine in-process and says why in one line.

Processes start with ``fork`` at the first cohort (the runtime is complete by
then); each worker sets its torch threads (engines/threads.py) and ignores SIGINT and SIGTERM: the
server process alone handles a stop (it finishes the round with its workers,
checkpoints, then ends them), so a signal to the whole process group (Ctrl-C,
``pkill -f``, a service manager) does not kill a worker mid-round. A worker
that dies anyway (SIGKILL, out of memory) ends the round with an
:class:`~fedforge.core.errors.EngineError` naming it, instead of a hang; the run
then resumes from its last checkpoint. The round's payload goes through one
file in shared memory, read once per worker and round, not pickled once per
client. Workers die with the server (``PR_SET_PDEATHSIG``), and a killed server's
payload file is deleted by the next pool's first round (its name carries the pid).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import islice
from multiprocessing.process import BaseProcess
from pathlib import Path

from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.core.errors import EngineError
from fedforge.core.orphans import sweep_orphans
from fedforge.engines import SimulationEngine
from fedforge.engines.serial import SerialEngine
from fedforge.engines.threads import set_threads, usable_cores
from fedforge.engines.vectorized import VectorizedEngine

Inner = SerialEngine | VectorizedEngine

# In a worker: the inner engine, handed over by the executor's initializer at the fork.
_INNER: Inner | None = None
_PAYLOAD: tuple[str, bytes] | None = None  # (path, bytes) of the round a worker last read
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PAYLOAD_PREFIX = "fedforge-payload-"  # then the server's pid: see orphans.py
JOB_BYTES = 64 << 20  # a vectorised job's dense updates at most (one message back)
DRAIN_S = 10.0  # how long closing waits for the jobs running to finish
MANAGER_S = 10.0  # how long for the executor's manager thread once the workers are killed
# Why a run on a CUDA device trains in the server process: workers are forked, and
# CUDA cannot be used in a process forked after it started (nor would processes
# sharing one GPU keep it busier than one process does).
DEVICE_IN_ONE_PROCESS = (
    "worker processes are forked and CUDA does not survive a fork; one process drives the GPU"
)


def resolve_workers(workers: int) -> int:
    """``workers`` as configured: 0 means one per usable core."""
    return usable_cores() if workers == 0 else workers


def _kill_all(processes: Iterable[BaseProcess]) -> None:
    """SIGKILL (workers ignore SIGTERM) and reap each process still alive."""
    processes = list(processes)
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join()


def _exit_code(process: BaseProcess, wait: float = 2.0) -> int | None:
    """``process``'s exit code; None while it runs. A dead worker may be being
    reaped by the executor's own thread: its ``waitpid`` then takes the status
    first, and ``exitcode`` reads None until that thread stores it."""
    deadline = time.monotonic() + wait
    while True:
        code = process.exitcode
        if code is not None or time.monotonic() > deadline:
            return code
        if not multiprocessing.connection.wait([process.sentinel], timeout=0):
            return None  # still running
        time.sleep(0.005)


def _dead_workers(processes: Iterable[BaseProcess]) -> str:
    """The workers that ended, with how ("pid 123 by SIGKILL")."""
    ended = []
    for process in processes:
        code = _exit_code(process)
        if code is None or code == 0:
            continue
        try:
            how = f"by {signal.Signals(-code).name}" if code < 0 else f"with exit code {code}"
        except ValueError:
            how = f"with exit code {code}"
        ended.append(f"pid {process.pid} {how}")
    return ", ".join(ended) or "its pid unknown"


def _worker_init(server_pid: int, inner: Inner, threads: int) -> None:
    global _INNER
    _INNER = inner  # handed over by the fork itself: its own executor's, never pickled
    set_threads(threads)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with(server_pid)


def _die_with(server_pid: int) -> None:
    """End this worker when the server process dies, however (SIGKILL, out of
    memory): it ignores SIGTERM, and an orphan would idle forever holding the
    server's pipes. Linux: the kernel sends SIGKILL on the parent's death."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: an orphan lives until its pipe breaks
        return
    if os.getppid() != server_pid:  # the server died before the prctl took effect
        os._exit(1)


def _run_chunk(job: tuple[str, list[ClientTask]]) -> list[tuple[int, bytes, float]]:
    """In a worker: the inner engine over one chunk of tasks."""
    global _PAYLOAD
    path, tasks = job
    if _PAYLOAD is None or _PAYLOAD[0] != path:
        _PAYLOAD = (path, Path(path).read_bytes())
    inner = _INNER
    assert inner is not None, "worker started without an engine"
    uploads = inner.run_cohort(tasks, _PAYLOAD[1])
    return [(u.client_id, u.data, u.seconds) for u in uploads]


def _write_payload(payload: bytes) -> str:
    """The round's payload in a file the workers read: in /dev/shm (memory) when
    it takes it, else in the temp folder (a small or full /dev/shm, e.g. a
    container's 64 MB, raised ENOSPC out of the run)."""
    shm = Path("/dev/shm")
    folders = [Path(tempfile.gettempdir())]
    if shm.is_dir() and os.access(shm, os.W_OK):
        folders.insert(0, shm)
    for k, folder in enumerate(folders):
        sweep_orphans(folder, _PAYLOAD_PREFIX)  # the files of servers killed mid-round
        path = None
        try:
            fd, path = tempfile.mkstemp(prefix=f"{_PAYLOAD_PREFIX}{os.getpid()}-", dir=folder)
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            return path
        except OSError as exc:  # out of space, or of inodes
            if path is not None:
                os.unlink(path)
            if k == len(folders) - 1:
                raise EngineError(
                    f"cannot write the round's model ({len(payload)} bytes) for the worker "
                    f"processes in {', '.join(map(str, folders))}: {exc}; free space there, or "
                    "set workers: 1"
                ) from None
    raise AssertionError("unreachable")


class PoolEngine(SimulationEngine):
    """``inner`` (serial or vectorised) run in ``workers`` forked processes of
    ``threads`` torch threads each (engines/threads.py: the usable cores divided
    among the workers, one each when there are as many workers as cores)."""

    def __init__(self, inner: Inner, workers: int, threads: int = 1) -> None:
        if workers < 2:
            raise ValueError(f"a pool needs at least 2 workers, got {workers}")
        if threads < 1:
            raise ValueError(f"a worker needs at least 1 thread, got {threads}")
        self.inner = inner
        self.workers = workers
        self.threads = threads
        self.name = f"{inner.name}x{workers}"
        self._pool: ProcessPoolExecutor | None = None
        # every worker the pool started, by pid: a broken pool may already have
        # cleared its own record when the round learns that one died
        self._started: dict[int, BaseProcess] = {}

    def _start(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # the inner engine rides with the executor's initializer: a module global
            # set here could be replaced by another pool's start (another thread)
            # before the first submit forks the workers
            ctx = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(
                self.workers,
                ctx,
                initializer=_worker_init,
                initargs=(os.getpid(), self.inner, self.threads),
            )
        return self._pool

    def _chunks(self, tasks: Sequence[ClientTask]) -> list[list[ClientTask]]:
        """Serial inner engine: one client per job (the pool balances uneven
        clients); vectorised: one contiguous chunk per worker (wide vmaps), cut
        into jobs of at most :data:`JOB_BYTES` of dense updates (a job's uploads
        come back in one message)."""
        if isinstance(self.inner, SerialEngine):
            return [[t] for t in tasks]
        cap = max(1, JOB_BYTES // self.inner.runtime.vector_bytes)
        size = min(-(-len(tasks) // self.workers), cap)
        return [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        if not tasks:
            return
        pool = self._start()
        chunks = self._chunks(tasks)
        path = _write_payload(payload)
        jobs = iter([(path, chunk) for chunk in chunks])
        pending: deque[Future[list[tuple[int, bytes, float]]]] = deque()
        try:
            try:
                # at most two jobs a worker in flight: the uploads of finished jobs
                # wait for the server, in memory, only that far ahead
                for job in islice(jobs, 2 * self.workers):
                    pending.append(pool.submit(_run_chunk, job))
                self._started.update(getattr(pool, "_processes", None) or {})  # forked now
                while pending:
                    results = pending.popleft().result()
                    pending.extend(pool.submit(_run_chunk, job) for job in islice(jobs, 1))
                    for client_id, data, seconds in results:
                        yield ClientUpload(client_id, data, seconds)
            except BrokenProcessPool:
                self._started.update(getattr(pool, "_processes", None) or {})
                dead = _dead_workers(self._started.values())
                self.close()
                raise EngineError(
                    f"a worker process died during the round ({dead}: killed, or out of "
                    "memory); the round is lost, resume the run from its last checkpoint"
                ) from None
        finally:
            for future in pending:  # the server stopped reading (an error): drop the rest
                future.cancel()
            os.unlink(path)

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        return self.inner.run_phase(phase, messages)

    def close(self) -> None:
        """Stop the workers (idempotent). What has not started is cancelled; the
        jobs running finish, for up to :data:`DRAIN_S`, and the workers leave on
        their own. Past that they are killed (they ignore SIGTERM, so SIGKILL),
        this process's own write end of the result pipe closed first: a worker
        killed while it sends a result leaves the executor's manager thread
        reading that pipe, and only the last write end closing ends its read
        (else it waits for ever, and so does this process at exit). A manager
        thread still alive after that is an :class:`EngineError`."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        live = getattr(pool, "_processes", None) or {}  # the dict the executor updates
        manager = getattr(pool, "_executor_manager_thread", None)  # shutdown drops it
        results = getattr(pool, "_result_queue", None)  # and this
        pending = getattr(pool, "_pending_work_items", None) or {}
        processes = dict(live)
        pool.shutdown(wait=False, cancel_futures=True)
        if manager is not None:
            manager.join(timeout=DRAIN_S)  # running jobs end, then the workers
        processes.update(live)
        if manager is not None and manager.is_alive():
            # the broken pool's manager sets an error on every job it still holds,
            # and a job cancelled already refuses one (InvalidStateError, which
            # ends that thread with a traceback): a cancelled job's future is
            # swapped for a blank one nobody reads (not removed: the thread may
            # be reading the table meanwhile)
            for item in list(pending.values()):
                if item.future.cancelled():
                    item.future = Future()
            writer = getattr(results, "_writer", None)
            if writer is not None:
                writer.close()
            _kill_all(processes.values())
            manager.join(timeout=MANAGER_S)  # it reaps the workers and closes its pipes
        _kill_all({**processes, **live}.values())  # any it started meanwhile
        if manager is not None and manager.is_alive():
            raise EngineError(
                f"the worker pool of {self.name} did not stop: its manager thread still "
                f"waits {MANAGER_S:g} s after the workers were killed, and this process "
                "may not exit (end it with Ctrl-C or kill)"
            )

    def __del__(self) -> None:
        with contextlib.suppress(EngineError):  # at collection there is nobody to tell
            self.close()

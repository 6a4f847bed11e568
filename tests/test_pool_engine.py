"""Worker processes (engines/pool.py): a cohort spread over forked one-thread
workers computes exactly what the engine it wraps computes in one process."""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from pathlib import Path

import pytest
import torch
from tests.conftest import MakeData

from conftest import RunStopped
from fedforge import config as config_mod
from fedforge.core.errors import ConfigError
from fedforge.engines import close_engine
from fedforge.engines.pool import PoolEngine, resolve_workers, usable_cores
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run

pytestmark = pytest.mark.all_cores  # workers and probes read the usable cores

SIZES = [7, 12, 5, 9, 10, 6]


def _no_children_left(seconds: float = 10.0) -> list[object]:
    """The worker processes still alive after ``seconds``: ending and reaping a
    killed process is asynchronous, and a loaded machine may need a moment."""
    deadline = time.monotonic() + seconds
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return list(multiprocessing.active_children())


def _cfg(**kw: object) -> config_mod.Config:
    base = config_mod.Config(
        model="2nn", engine="serial", num_clients=len(SIZES), client_fraction=0.5, local_epochs=2,
        batch_size=4, lr=0.05, rounds=3, target_accuracy=None,
        evaluation=config_mod.EvaluationConfig(every=3),
        dtype="float64",
    )  # fmt: skip
    return config_mod.override(base, dict(kw))


@pytest.mark.parametrize("model", ["2nn", "cnn"])
def test_serial_workers_bit_identical_to_serial(
    model: str, make_data: MakeData, one_thread: None
) -> None:
    data = make_data(SIZES, dtype=torch.float32)
    cfg = _cfg(model=model, dtype="float32", local_epochs=1)
    one = run(cfg, data, store=False)
    two = run(config_mod.override(cfg, {"workers": 2}), data, store=False)
    assert two.summary["engine"] == "serialx2"
    assert torch.equal(one.params, two.params)  # float32, bit for bit
    assert [r.train_loss for r in one.rounds] == [r.train_loss for r in two.rounds]
    assert [r.bytes_up for r in one.rounds] == [r.bytes_up for r in two.rounds]
    assert _no_children_left() == []  # the run stopped its workers


def test_vectorized_workers_equal_serial_float64(make_data: MakeData, one_thread: None) -> None:
    data = make_data(SIZES)
    serial = run(_cfg(), data, store=False)
    pooled = run(_cfg(engine="vectorized", workers=2), data, store=False)
    assert pooled.summary["engine"] == "vectorizedx2"
    torch.testing.assert_close(pooled.params, serial.params, rtol=0, atol=1e-9)


def test_vectorized_jobs_are_capped_in_bytes_and_compute_the_same(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    """A vectorised worker's chunk is cut into jobs of at most JOB_BYTES of dense
    updates (one message back each, at most two a worker in flight): here 2
    clients a job (2NN: 199,210 float64 = 1.6 MB a client), 3 jobs for the
    6-client cohort; the same parameters as one job a worker."""
    from fedforge.engines import pool

    data = make_data(SIZES)
    cfg = _cfg(engine="vectorized", workers=2, client_fraction=1.0)
    whole = run(cfg, data, store=False)
    sizes: list[int] = []
    real = PoolEngine._chunks

    def spy(self: PoolEngine, tasks: object) -> list[list[object]]:
        out = real(self, tasks)  # type: ignore[arg-type]
        sizes.extend(len(c) for c in out)
        return out  # type: ignore[return-value]

    monkeypatch.setattr(pool, "JOB_BYTES", 2 * 199_210 * 8)
    monkeypatch.setattr(PoolEngine, "_chunks", spy)
    capped = run(cfg, data, store=False)
    assert sizes[:3] == [2, 2, 2]
    torch.testing.assert_close(capped.params, whole.params, rtol=0, atol=1e-12)
    assert [r.train_loss for r in capped.rounds] == pytest.approx(
        [r.train_loss for r in whole.rounds], abs=1e-12
    )


def test_at_most_two_jobs_a_worker_are_in_flight(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    """Jobs of one client each (6): four submitted before the first upload is
    read, then one more for each job taken, in cohort order."""
    from concurrent.futures import ProcessPoolExecutor

    from fedforge.client.runtime import ClientTask
    from fedforge.core import wire
    from fedforge.engines import pool

    monkeypatch.setattr(pool, "JOB_BYTES", 1)
    exp = build(_cfg(engine="vectorized", workers=2, client_fraction=1.0), make_data(SIZES))
    submitted: list[object] = []
    real = ProcessPoolExecutor.submit

    def counting(self: ProcessPoolExecutor, fn: object, *args: object) -> object:
        submitted.append(args)
        return real(self, fn, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ProcessPoolExecutor, "submit", counting)
    tasks = [ClientTask(c, 0, exp.algorithm.plan(0), 0) for c in range(len(SIZES))]
    payload = wire.encode({"params": exp.initial_params})
    try:
        uploads = exp.engine.run_cohort(tasks, payload)
        first = next(uploads)
        assert len(submitted) == 5  # 2 x 2 workers, and the next as the first was taken
        rest = list(uploads)
        assert len(submitted) == 6
        assert [u.client_id for u in [first, *rest]] == list(range(len(SIZES)))
    finally:
        exp.engine.close()


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"algorithm": "scaffold"}, "keeps per-client state"),
        (
            {"communication": {"uplink": "topk", "fraction": 0.1, "error_feedback": True}},
            "error feedback",
        ),
    ],
)
def test_stateful_runs_stay_in_one_process(
    extra: dict[str, object], why: str, make_data: MakeData
) -> None:
    exp = build(_cfg(workers=2, **extra), make_data(SIZES))
    assert not isinstance(exp.engine, PoolEngine)
    assert exp.note is not None and "workers: 2 cannot be used" in exp.note and why in exp.note


def test_workers_zero_means_one_per_core() -> None:
    assert resolve_workers(0) == usable_cores() >= 1
    assert resolve_workers(3) == 3
    with pytest.raises(ConfigError, match="workers.*-1.*integer >= 0"):
        _cfg(workers=-1)


def test_workers_zero_keeps_the_fused_path_in_one_process(make_data: MakeData) -> None:
    """``workers: 0``: the vectorised engine's fused perceptron path runs in this
    process (measured faster, changelog.md); its vmap path, the serial engine and
    an explicit count take the workers."""
    cores = usable_cores()
    if cores < 2:
        pytest.skip("one usable core: no workers either way")
    data = make_data(SIZES)
    momentum = {"momentum": 0.9}
    cases = [
        ({"engine": "vectorized", "workers": 0}, "vectorized"),
        ({"engine": "auto", "workers": 0}, "vectorized"),
        ({"engine": "vectorized", "workers": 0, "local": momentum}, f"vectorizedx{cores}"),
        ({"engine": "serial", "workers": 0}, f"serialx{cores}"),
        ({"engine": "vectorized", "workers": 2}, "vectorizedx2"),
    ]
    for extra, name in cases:
        exp = build(_cfg(**extra), data)
        try:
            assert exp.engine.name == name, extra
        finally:
            close_engine(exp.engine)


def test_more_workers_than_cores_are_lowered_to_the_cores(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,024 workers (the most a config may ask for) would fork 1,024 processes:
    the engine takes the usable cores and says so (results do not depend on the
    worker count)."""
    import fedforge.server.engine_choice as engine_choice

    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 2)
    exp = build(_cfg(workers=1024), make_data(SIZES))
    assert exp.engine.name.endswith("x2")
    assert "workers: 1024 lowered to 2, the cores this process may use" in (exp.note or "")
    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 1)
    one = build(_cfg(workers=3), make_data(SIZES))
    assert not isinstance(one.engine, PoolEngine) and "lowered to 1" in (one.note or "")


def test_resume_with_workers_is_exact(
    make_data: MakeData, run_stopped: RunStopped, tmp_path: Path, one_thread: None
) -> None:
    """A run on worker processes stopped by SIGTERM resumes to the uninterrupted
    run's parameters, bit for bit."""
    data = make_data(SIZES, dtype=torch.float32)
    cfg = _cfg(dtype="float32", workers=2, rounds=4, evaluation={"every": 2}, checkpoint_every=1)
    full = run(config_mod.override(cfg, {"runs_dir": str(tmp_path / "a")}), data)
    stopped = run_stopped(config_mod.override(cfg, {"runs_dir": str(tmp_path / "b")}), data, 2)
    assert stopped.stopped == "SIGTERM" and len(stopped.rounds) < 4
    resumed = resume(stopped.run_dir, data)
    assert torch.equal(resumed.params, full.params)
    assert _no_children_left() == []


def test_a_dead_worker_ends_the_round_with_an_error_not_a_hang(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch, one_thread: None, tmp_path: Path
) -> None:
    """A worker killed mid-round (SIGKILL, out of memory) raises EngineError
    naming what happened; the engine's other workers are stopped."""
    import os
    import signal

    from fedforge.core.errors import EngineError
    from fedforge.server import loop

    server = os.getpid()
    real_build = loop.build

    def dying_build(c: object, d: object = None, t: object = None) -> object:
        exp = real_build(c, d, t)  # type: ignore[arg-type]
        runtime = exp.engine.inner.runtime  # type: ignore[attr-defined]
        data_fn = runtime.data_fn

        def client_data(client_id: int) -> object:
            if os.getpid() != server and client_id == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return data_fn(client_id)

        runtime.data_fn = client_data
        return exp

    monkeypatch.setattr(loop, "build", dying_build)
    cfg = _cfg(dtype="float32", workers=2, client_fraction=1.0, rounds=2)
    with pytest.raises(
        EngineError, match=r"worker process died during the round \(pid \d+ by SIGKILL"
    ):
        run(cfg, make_data(SIZES, dtype=torch.float32), store=False)
    assert _no_children_left() == []
    payloads = [*Path("/dev/shm").glob(f"fedforge-payload-{server}-*")]
    assert (
        payloads == [] and [*Path(tempfile.gettempdir()).glob(f"fedforge-payload-{server}-*")] == []
    )
    stored = config_mod.override(cfg, {"runs_dir": str(tmp_path)})
    with pytest.raises(EngineError):
        run(stored, make_data(SIZES, dtype=torch.float32))
    from fedforge.store import RunStore, list_runs

    (info,) = list_runs(tmp_path)
    with RunStore.open(info.path) as store:  # the store says what, and how to go on
        why = (store.summary() or {})["error"]
    assert why.startswith("run stopped: EngineError: a worker process died")
    assert why.endswith(f"resume with: fedforge resume {info.path}")


_KILLED_SERVER = """
import multiprocessing, sys, time
import torch
from tests.conftest import _make_data
from fedforge import config as c
from fedforge.engines import SimulationEngine
from fedforge.server import loop

class Hang(SimulationEngine):  # round 1: say who the workers are, then wait to be killed
    name = "hang"
    def __init__(self, inner):
        self.inner = inner
    def run_cohort(self, tasks, payload):
        if tasks[0].round_idx == 1:
            print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
            time.sleep(120)
        return self.inner.run_cohort(tasks, payload)
    def close(self):
        self.inner.close()

real_build = loop.build
def build(cfg, data=None, task=None):
    exp = real_build(cfg, data, task)
    exp.engine = Hang(exp.engine)
    return exp
loop.build = build
cfg = c.Config(model="2nn", engine="serial", num_clients=6, client_fraction=0.5, batch_size=4,
               rounds=3, target_accuracy=None, workers=2, checkpoint_every=1,
               runs_dir=sys.argv[1])
loop.run(cfg, _make_data([7, 12, 5, 9, 10, 6], dtype=torch.float32))
"""


def test_a_killed_server_takes_its_workers_and_lock_with_it(tmp_path: Path) -> None:
    """SIGKILL the server mid-run: its forked workers (which ignore SIGTERM) die
    with it instead of idling as orphans, and none of them holds the run's lock,
    so the run can be resumed at once."""
    import os
    import signal
    import subprocess
    import sys

    from fedforge.server.state import RunLock

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'src'}", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SERVER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        workers = [int(p) for p in server.stdout.readline().split()]
    finally:
        server.kill()
        server.wait()
    assert len(workers) == 2

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    deadline = time.monotonic() + 10.0
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftover = [p for p in workers if alive(p)]
    for p in leftover:
        os.kill(p, signal.SIGKILL)
    assert leftover == []
    (run_dir,) = tmp_path.iterdir()
    RunLock(run_dir).acquire().release()  # free: no worker kept the server's lock


def test_a_killed_servers_payload_file_is_swept(make_data: MakeData, one_thread: None) -> None:
    """A server SIGKILLed mid-round leaves its payload file in shared memory; the
    next pool round deletes the files of servers that no longer exist, and only
    those."""
    import os
    import subprocess
    import sys
    import tempfile

    from fedforge.engines import pool

    shm = Path("/dev/shm")
    folder = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)  # fmt: skip
    stale = folder / f"{pool._PAYLOAD_PREFIX}{dead}-test"
    live = folder / f"{pool._PAYLOAD_PREFIX}{os.getpid()}-test"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    try:
        run(_cfg(dtype="float32", workers=2, rounds=1), make_data(SIZES, dtype=torch.float32),
            store=False)  # fmt: skip
        assert not stale.exists() and live.exists()
    finally:
        stale.unlink(missing_ok=True)
        live.unlink(missing_ok=True)


def test_two_pools_started_before_either_forks_train_their_own_clients(
    make_data: MakeData, one_thread: None
) -> None:
    """The inner engine sat in a module global until the first submit forked the
    workers: a second pool started meanwhile (another thread) made the first
    pool's workers train the second run's data."""
    from fedforge.client.runtime import ClientTask
    from fedforge.core import wire
    from fedforge.engines import close_engine

    a, b = make_data(SIZES, seed=1), make_data(SIZES, seed=2)
    exp_a, exp_b = build(_cfg(workers=2), a), build(_cfg(workers=2), b)
    pool_a, pool_b = exp_a.engine, exp_b.engine
    assert isinstance(pool_a, PoolEngine) and isinstance(pool_b, PoolEngine)
    pool_a._start(), pool_b._start()  # neither has forked yet
    tasks = [ClientTask(c, 0, exp_a.algorithm.plan(0), 7) for c in range(3)]
    payload = wire.encode({"params": exp_a.initial_params})
    try:
        pooled = {u.client_id: u.data for u in pool_a.run_cohort(tasks, payload)}
    finally:
        close_engine(pool_a), close_engine(pool_b)
    alone = {u.client_id: u.data for u in pool_a.inner.run_cohort(tasks, payload)}
    assert pooled == alone


def test_a_full_dev_shm_puts_the_payload_in_the_temp_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container's 64 MB /dev/shm raised ENOSPC out of the run, with a traceback."""
    import errno
    import os
    import tempfile

    from fedforge.engines import pool

    real = os.fdopen
    calls: list[int] = []

    def full_first(fd: int, *args: object, **kw: object) -> object:
        calls.append(fd)
        if len(calls) == 1:
            os.close(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, *args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(pool.os, "fdopen", full_first)
    path = pool._write_payload(b"model")
    try:
        assert os.path.dirname(path) == tempfile.gettempdir()
        with open(path, "rb") as f:
            assert f.read() == b"model"
    finally:
        os.unlink(path)
    assert not [
        p for p in os.listdir("/dev/shm") if p.startswith(f"fedforge-payload-{os.getpid()}")
    ]


def test_a_dead_worker_is_named_while_another_thread_reaps_it() -> None:
    """The executor's own thread may reap a SIGKILLed worker: its waitpid takes
    the status, and ``exitcode`` reads None until that thread stores it (the
    message said 'its pid unknown' under load). A dead worker's sentinel is
    ready; the code is waited for. A running worker is not waited for."""
    import os

    from fedforge.engines.pool import _dead_workers

    read, write = os.pipe()
    os.close(write)  # a dead process's sentinel: ready

    class Reaped:
        pid, sentinel, reads = 4242, read, 0

        @property
        def exitcode(self) -> int | None:
            self.reads += 1
            return -9 if self.reads > 3 else None  # stored by the other thread

    alive_read, alive_write = os.pipe()

    class Running:
        pid, sentinel, exitcode = 4343, alive_read, None

    try:
        assert _dead_workers([Running(), Reaped()]) == "pid 4242 by SIGKILL"  # type: ignore[list-item]
        assert _dead_workers([Running()]) == "its pid unknown"  # type: ignore[list-item]
    finally:
        for fd in (read, alive_read, alive_write):
            os.close(fd)

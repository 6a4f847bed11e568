"""Shared fixtures: tiny synthetic federated data sets and the real MNIST folder."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedforge.data import Partition
from fedforge.data.federated import FederatedData
from fedforge.engines import SimulationEngine
from fedforge.engines.threads import set_threads

MakeData = Callable[..., FederatedData]

# engine: auto takes its static rule in tests (the probe takes seconds per model
# and machine, and its pick would differ between machines); tests/test_threads_probe.py
# turns it on with a tiny length and a cache in a temp folder
os.environ.setdefault("FEDFORGE_PROBE", "off")


# Every core this process may use, before an xdist worker keeps to its share.
_ALL_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
_ALL_THREADS = torch.get_num_threads()


def _own_cores_per_xdist_worker() -> bool:
    """Under pytest-xdist (``make test`` runs one worker per core), keep each worker
    and every process it starts (servers, clients, Ray nodes inherit the affinity)
    to a share of the cores of its own, and torch to that many threads: a run's
    thread plan divides its usable cores, so two workers never spin OpenMP threads
    on each other's cores, which slows torch many times over. Serial pytest keeps
    every core. True when this worker was given a share."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or count < 2 or not _ALL_CORES:
        return False
    share = len(_ALL_CORES) // count
    if share < 1:  # more workers than cores: leave the scheduler to share them
        return False
    index = int(worker[2:]) % count
    os.sched_setaffinity(0, _ALL_CORES[index * share : (index + 1) * share])
    set_threads(share)
    return True


_SHARED_OUT = False  # set by pytest_configure in a worker given a share


def pytest_configure(config: pytest.Config) -> None:
    """Pins an xdist worker at its start (here, not at import: a subprocess that
    imports this module inherits the worker's environment and must not pin itself)."""
    global _SHARED_OUT
    _SHARED_OUT = _own_cores_per_xdist_worker()


@pytest.fixture(autouse=True)
def _all_cores_when_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``all_cores`` (worker processes, the engine probe: what reads
    the usable cores) gets every core back for its duration under pytest-xdist."""
    if not _SHARED_OUT or request.node.get_closest_marker("all_cores") is None:
        yield
        return
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _ALL_CORES)
    threads = set_threads(_ALL_THREADS)
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)
        set_threads(threads)


# A one-round float64 logistic regression over 4 clients, every one each round:
# the small config of the data- and weight-rule tests (override what differs).
TINY_LOGREG: dict[str, Any] = {
    "model": "logreg",
    "num_clients": 4,
    "client_fraction": 1.0,
    "batch_size": 4,
    "lr": 0.05,
    "rounds": 1,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


def _make_data(
    sizes: Sequence[int],
    num_test: int = 16,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> FederatedData:
    """Random 28x28 images and labels split over clients of the given sizes
    (client k holds the next ``sizes[k]`` examples, in order)."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    train_x = torch.randn(n, 1, 28, 28, generator=gen, dtype=dtype)
    train_y = torch.randint(0, 10, (n,), generator=gen)
    test_x = torch.randn(num_test, 1, 28, 28, generator=gen, dtype=dtype)
    test_y = torch.randint(0, 10, (num_test,), generator=gen)
    bounds = np.cumsum([0, *sizes])
    parts = tuple(np.arange(bounds[k], bounds[k + 1]) for k in range(len(sizes)))
    return FederatedData(train_x, train_y, test_x, test_y, Partition(parts), num_classes=10)


@pytest.fixture
def make_data() -> MakeData:
    """A factory ``make_data(sizes, num_test=16, seed=0, dtype=float64)``."""
    return _make_data


@pytest.fixture
def mnist_dir() -> Path:
    """The real MNIST folder from ``$FEDFORGE_DATA``; skips the test when unset."""
    root = os.environ.get("FEDFORGE_DATA")
    if not root:
        pytest.skip("FEDFORGE_DATA is not set: no real MNIST")
    path = Path(root)
    if not ((path / "mnist").is_dir() or (path / "train-images-idx3-ubyte.gz").is_file()):
        pytest.skip(f"FEDFORGE_DATA={root} holds no MNIST")
    return path


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run torch on one intra-op thread for the test, runs too (their default
    threads come from FEDFORGE_THREADS then). On this shared two-core machine,
    two spinning OpenMP threads competing with other jobs run 10-20x slower than one."""
    monkeypatch.setenv("FEDFORGE_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class SigtermAt(SimulationEngine):
    """An engine wrapper that sends this process SIGTERM once while round ``at`` runs
    (the loop finishes the round, checkpoints and stops, as for an outside signal;
    a round that asks the engine for several cohorts, one a cluster, is signalled once)."""

    name = "sigterm"

    def __init__(self, inner: Any, at: int) -> None:
        self.inner, self.at, self.fired = inner, at, False

    def run_cohort(self, tasks: Sequence[Any], payload: bytes) -> Iterator[Any]:
        if tasks and tasks[0].round_idx == self.at and not self.fired:
            self.fired = True
            os.kill(os.getpid(), signal.SIGTERM)
        yield from self.inner.run_cohort(tasks, payload)

    def run_phase(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.run_phase(*args, **kwargs)

    def close(self) -> None:
        from fedforge.engines import close_engine

        close_engine(self.inner)


@pytest.fixture(scope="session")
def report_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two small real runs the report tests read (tests/report_pages.py), made once."""
    from tests.report_pages import make_report_runs

    return make_report_runs(tmp_path_factory.mktemp("report"))


RunStopped = Callable[[Any, FederatedData, int], Any]


def wrap_engine(monkeypatch: pytest.MonkeyPatch, wrap: Callable[[Any], Any]) -> None:
    """Every experiment the loop builds from now on runs on ``wrap(its engine)``
    (a tampering, crashing or signalling client, a filter of the cohort)."""
    from fedforge.server import loop

    real_build = loop.build

    def build(c: Any, d: Any = None, t: Any = None) -> Any:
        exp = real_build(c, d, t)
        exp.engine = wrap(exp.engine)
        return exp

    monkeypatch.setattr(loop, "build", build)


@pytest.fixture
def run_stopped(monkeypatch: pytest.MonkeyPatch) -> RunStopped:
    """``run_stopped(cfg, data, at)``: run ``cfg`` until SIGTERM arrives in round
    ``at``; returns the stopped run's result (build is restored afterwards)."""
    from fedforge.server import loop

    def go(cfg: Any, data: FederatedData, at: int) -> Any:
        real_build = loop.build

        def stopping_build(c: Any, d: Any = None, t: Any = None) -> Any:
            exp = real_build(c, d, t)
            exp.engine = SigtermAt(exp.engine, at)
            return exp

        monkeypatch.setattr(loop, "build", stopping_build)
        try:
            return loop.run(cfg, data)
        finally:
            monkeypatch.setattr(loop, "build", real_build)

    return go

"""``engine: ray`` on a real two-node Ray cluster of this machine
(tests/ray_cluster.py: ``ray start --head`` and a second ``ray start
--address``): one worker on each node gives the serial engine's model in
float64; a worker process killed mid-round is replaced and its calls run again
(``retry``: the serial model exactly), or its clients count as the round's
dropouts (``dropout``), or, holding per-client state, ends the run to be
resumed; and a driver killed by SIGKILL leaves no actor behind and resumes bit
for bit through the CLI. Slow: the cluster alone takes ~30 s to start here."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.test_ray_engine import _cfg, count_shares
from tests.test_resume import ENV, _rows, _start, _wait_for_rounds

import fedforge
from deploy_procs import FEDFORGE
from fedforge.config import parse
from fedforge.core.errors import EngineError
from fedforge.server.hooks import RoundEnd, RoundHook, RoundInfo
from fedforge.store import RunStore
from fedforge.store.final import FINAL_META, load_final
from ray_cluster import LocalCluster, alive, cpu_seconds, start_two_nodes, wait_until_gone

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

# MNIST 2NN, 8 clients a round, enough local work (~0.5 s of CPU a worker a
# round) that a kill lands inside a round
MNIST: dict[str, Any] = {
    "model": "2nn",
    "num_clients": 100,
    "client_fraction": 0.08,
    "batch_size": 50,
    "local_epochs": 5,
    "rounds": 4,
    "lr": 0.05,
    "dtype": "float64",
    "engine": "serial",  # the reference (engine: auto could pick the vectorized one)
    "threads": 1,
    "target_accuracy": None,
    "checkpoint_every": 1,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """The two nodes, both alive; the runs' processes reach them as this one does."""
    started = start_two_nodes()
    try:
        with pytest.MonkeyPatch.context() as env:
            for key in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED"):
                env.setenv(key, started.env[key])
            env.delenv("RAY_ADDRESS", raising=False)
            ray.init(address=started.address, logging_level="ERROR")
            try:
                nodes = _alive_nodes(2)
            finally:
                ray.shutdown()
            assert sorted(nodes) == sorted(started.raylets().values())
            assert sum("second_node" in n["Resources"] for n in nodes.values()) == 1
            yield started
    finally:
        if ray.is_initialized():
            ray.shutdown()
        started.stop()


def _alive_nodes(count: int) -> dict[str, dict[str, Any]]:
    """The cluster's live nodes by id, once there are ``count`` (a bounded wait)."""
    deadline = time.monotonic() + 60
    while True:
        nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        if len(nodes) >= count or time.monotonic() > deadline:
            assert len(nodes) == count, nodes
            return nodes
        time.sleep(0.5)


def _on(cluster: LocalCluster, **ray_kw: Any) -> dict[str, Any]:
    """The ``ray:`` section of a run on the cluster, two workers."""
    return {"ray": {"address": cluster.address, "workers": 2, **ray_kw}}


class _Nodes(RoundHook):
    """The nodes the run's workers live on (their processes' raylets), read at
    the first round's start, and the cluster's live nodes as Ray lists them."""

    name = "nodes"

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.workers: list[str] = []
        self.alive: set[str] = set()

    def round_start(self, info: RoundInfo) -> None:
        if info.round_idx == 0:
            engine: Any = info.exp.engine
            self.workers = [self.cluster.node_of(p) for p in engine.worker_pids()]
            self.alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def test_two_nodes_one_worker_each_equal_serial(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    shares = count_shares(monkeypatch)
    serial = fedforge.run(_cfg("serial"))
    where = _Nodes(cluster)
    each = fedforge.run(_cfg("ray", **_on(cluster, aggregate_on_workers=False)), hooks=[where])
    assert each.summary["engine"] == "rayx2"
    assert len(set(where.workers)) == 2 and set(where.workers) == where.alive
    assert torch.equal(each.params, serial.params)
    assert not shares
    summed = fedforge.run(_cfg("ray", **_on(cluster)))
    # every round summed on the two nodes (round 1 in two passes: its uploads
    # are judged by their own median norm), 12 clients a round
    assert len(shares) == 8 and sum(shares) == 4 * 12
    assert float((summed.params - serial.params).abs().max()) <= 1e-9
    assert [r.cohort_size for r in summed.rounds] == [r.cohort_size for r in serial.rounds]


def test_scaffold_on_two_nodes_equals_serial(cluster: LocalCluster) -> None:
    """SCAFFOLD's control variates live on both nodes (each worker its clients')."""
    serial = fedforge.run(_cfg("serial", algorithm="scaffold"))
    where = _Nodes(cluster)
    spread = fedforge.run(_cfg("ray", algorithm="scaffold", **_on(cluster)), hooks=[where])
    assert len(set(where.workers)) == 2
    assert torch.equal(spread.params, serial.params)


# ----------------------------------------------------------------------------- a worker killed


class _KillMidRound(RoundHook):
    """SIGKILLs worker ``worker``'s process in round ``round_idx``, once that
    process has trained for ``cpu`` seconds of the round: the round is under way
    (and not over: the kill is given up if the round ends first)."""

    name = "kill"

    def __init__(self, round_idx: int, worker: int, cpu: float = 0.15) -> None:
        self.round_idx, self.worker, self.cpu = round_idx, worker, cpu
        self.lock = threading.Lock()
        self.over = False
        self.killed: int | None = None
        self.engine: Any = None
        self.rounds: dict[int, tuple[list[int], list[int]]] = {}  # cohort, used

    def round_start(self, info: RoundInfo) -> None:
        if info.round_idx != self.round_idx:
            return
        self.engine = info.exp.engine
        pid = self.engine.worker_pids()[self.worker]
        threading.Thread(target=self._kill, args=(pid, cpu_seconds(pid)), daemon=True).start()

    def _kill(self, pid: int, start: float) -> None:
        deadline = time.monotonic() + 120
        while cpu_seconds(pid) < start + self.cpu and time.monotonic() < deadline:
            time.sleep(0.002)
        with self.lock:
            if not self.over and alive(pid):
                os.kill(pid, signal.SIGKILL)
                self.killed = pid

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        self.rounds[info.round_idx] = (sorted(info.cohort), list(end.used))
        if info.round_idx == self.round_idx:
            with self.lock:
                self.over = True
            assert self.killed is not None, "the round ended before its worker was killed"


@pytest.fixture(scope="module")
def mnist() -> dict[str, Any]:
    """The MNIST config on ``$FEDFORGE_DATA``'s copy (the tests skip without one)."""
    root = os.environ.get("FEDFORGE_DATA")
    if not root or not (Path(root) / "mnist").is_dir():
        pytest.skip("FEDFORGE_DATA holds no MNIST")
    return {**MNIST, "data_dir": root}


def _mnist_cfg(mnist: dict[str, Any], tmp: Path, **kw: Any) -> Any:
    return parse.from_dict({**mnist, "runs_dir": str(tmp), **kw})


@pytest.fixture(scope="module")
def serial_mnist(mnist: dict[str, Any], tmp_path_factory: Any) -> Path:
    result = fedforge.run(_mnist_cfg(mnist, tmp_path_factory.mktemp("serial")))
    assert result.run_dir is not None
    return result.run_dir


@pytest.fixture(scope="module")
def serial_scaffold(mnist: dict[str, Any], tmp_path_factory: Any) -> Path:
    result = fedforge.run(_mnist_cfg(mnist, tmp_path_factory.mktemp("s"), algorithm="scaffold"))
    assert result.run_dir is not None
    return result.run_dir


def _assert_same_run(run_dir: Path, reference: Path) -> None:
    """The same final model, round rows (but times) and client rows, bit for bit."""
    got, want = load_final(run_dir)["params"], load_final(reference)["params"]
    assert got.dtype == torch.float64 and torch.equal(got, want)
    rounds, clients = _rows(run_dir)
    assert len(rounds) == MNIST["rounds"]
    assert (rounds, clients) == _rows(reference)


def test_a_worker_killed_mid_round_is_retried_on_a_new_one(
    cluster: LocalCluster, mnist: dict[str, Any], serial_mnist: Path, tmp_path: Path
) -> None:
    kill = _KillMidRound(round_idx=1, worker=1)
    cfg = _mnist_cfg(mnist, tmp_path, engine="ray", **_on(cluster, aggregate_on_workers=False))
    result = fedforge.run(cfg, hooks=[kill])
    assert kill.killed is not None and not alive(kill.killed)
    assert kill.engine.restarts == 1  # a new worker took the killed one's place
    assert result.run_dir is not None
    _assert_same_run(result.run_dir, serial_mnist)


def test_a_worker_killed_mid_round_loses_its_clients_as_dropouts(
    cluster: LocalCluster,
    mnist: dict[str, Any],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Summed on the workers: the killed worker's share of the round (its clients,
    ``c % 2 == 1``) is lost, the other worker's arrives; the next rounds are whole."""
    kill = _KillMidRound(round_idx=1, worker=1)
    cfg = _mnist_cfg(mnist, tmp_path, engine="ray", **_on(cluster, on_worker_failure="dropout"))
    result = fedforge.run(cfg, hooks=[kill])
    assert kill.killed is not None and kill.engine.restarts == 1
    assert "Ray worker 1 was lost; its clients of this round count as dropouts" in (
        capfd.readouterr().err
    )
    cohort, used = kill.rounds[1]
    assert used == [c for c in cohort if c % 2 == 0] and len(used) < len(cohort)
    for r in (0, 2, 3):
        assert kill.rounds[r][1] == kill.rounds[r][0]
    assert result.run_dir is not None
    with RunStore.open(result.run_dir) as store:
        per_round = [sorted(c.client_id for c in store.client_rounds() if c.round_idx == r)
                     for r in range(MNIST["rounds"])]  # fmt: skip
    assert per_round == [kill.rounds[r][1] for r in range(MNIST["rounds"])]


@pytest.mark.parametrize("failure", ["retry", "dropout"])
def test_a_worker_killed_in_the_first_round_two_passes(
    cluster: LocalCluster,
    mnist: dict[str, Any],
    serial_mnist: Path,
    tmp_path: Path,
    failure: str,
) -> None:
    """The first round, summed on the workers in two passes (its uploads judged
    by their own median norm), loses worker 1: retried, the run is the serial
    one to rounding; as dropouts, its clients leave the round and the median."""
    kill = _KillMidRound(round_idx=0, worker=1)
    cfg = _mnist_cfg(mnist, tmp_path, engine="ray", **_on(cluster, on_worker_failure=failure))
    result = fedforge.run(cfg, hooks=[kill])
    assert kill.killed is not None and not alive(kill.killed)
    assert kill.engine.restarts == 1
    cohort, used = kill.rounds[0]
    if failure == "retry":
        want = load_final(serial_mnist)["params"]
        assert float((result.params - want).abs().max()) <= 1e-9
        assert used == cohort
    else:
        assert used == [c for c in cohort if c % 2 == 0] and len(used) < len(cohort)
    for r in (1, 2, 3):
        assert kill.rounds[r][1] == kill.rounds[r][0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU here: the worker has one")
def test_a_device_the_workers_node_lacks_is_one_line(cluster: LocalCluster) -> None:
    """The second node declares a GPU that torch (a CPU build) cannot use: the
    worker placed there says so in one line, not as a lost worker."""
    cfg = _cfg("ray", device="cuda", **_on(cluster, workers=1, num_gpus=1))
    with pytest.raises(EngineError) as err:
        fedforge.run(cfg)
    line = str(err.value)
    assert "the Ray worker on" in line and "cannot train there" in line
    assert "'device'" in line and "cuda" in line
    assert "lost" not in line and "\n" not in line


def test_a_worker_killed_holding_state_ends_the_run_and_resume_finishes_it(
    cluster: LocalCluster, mnist: dict[str, Any], serial_scaffold: Path, tmp_path: Path
) -> None:
    kill = _KillMidRound(round_idx=1, worker=0)
    cfg = _mnist_cfg(mnist, tmp_path, engine="ray", algorithm="scaffold", **_on(cluster))
    with pytest.raises(EngineError) as err:
        fedforge.run(cfg, hooks=[kill])
    line = str(err.value)
    assert "held its clients' per-client state" in line and "resume" in line
    assert kill.killed is not None
    (run_dir,) = tmp_path.iterdir()
    resumed = fedforge.resume(run_dir)
    assert resumed.summary["engine"] == "rayx2"
    _assert_same_run(run_dir, serial_scaffold)


# ----------------------------------------------------------------------------- the driver killed


def test_driver_sigkill_leaves_no_actor_and_cli_resume_is_bit_identical(
    cluster: LocalCluster, mnist: dict[str, Any], serial_scaffold: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    config = {**mnist, "engine": "ray", "algorithm": "scaffold", **_on(cluster)}
    proc = _start(config, runs)
    run_dir = _wait_for_rounds(proc, runs, 2)
    actors = cluster.actors("ClientWorker")
    assert len(actors) == 2 and len({cluster.node_of(p) for p in actors}) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (run_dir / FINAL_META).exists(), "the run finished before the kill"
    with RunStore.open(run_dir) as store:
        assert store.status == "running" and len(store.rounds()) >= 2
    # Ray ends a dead driver's actors (they are not detached)
    assert wait_until_gone(actors, 60) == [], "the killed driver's actors still run"
    done = subprocess.run(
        [*FEDFORGE, "resume", run_dir.name, "--runs-dir", str(runs), "-q"],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    _assert_same_run(run_dir, serial_scaffold)

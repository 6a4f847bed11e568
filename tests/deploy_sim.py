"""The deployment fault tests' tools: the run store as another process writes
it, the simulator without the clients a deployment lost (the expected models),
and client processes that die where a test says (FEDFORGE_TEST_EXIT_AT)."""

from __future__ import annotations

import os
import random
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import fedforge
from deploy_procs import Proc, run_dir_of, start_client
from fedforge import config as config_mod
from fedforge import run
from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.engines import SimulationEngine, close_engine
from fedforge.server import loop
from fedforge.server.loop import RunResult

ALL = set(range(6))
SECAGG = {"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}}
# secure aggregation refuses cold start: the server must not see a client's own numbers
QUIET = {"cold_start": False}
# the phases of a secure-aggregation round in order; "train" is the masked
# input's upload, after its phase message
ORDER = ["advertise", "share_keys", "masked_input", "train", "unmask"]


@pytest.fixture
def deploy_env(monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    """The server and client processes import the fedforge this test imports; the
    simulator runs on one torch thread (FEDFORGE_THREADS=1 reaches the processes
    too)."""
    src = str(Path(fedforge.__file__).resolve().parents[1])
    rest = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, rest]) if rest else src)
    monkeypatch.delenv("FEDFORGE_TEST_EXIT_AT", raising=False)


# ---------------------------------------------------------------- the run store
def _store_file(tmp: Path) -> Path | None:
    """The run's store once its directory has its name (it is made under a
    hidden temporary one, then renamed)."""
    found = [p for p in (tmp / "runs").glob("*/store.sqlite") if not p.parent.name.startswith(".")]
    return found[0] if found else None


def _query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` on a store another process may be writing (read-only; retried while
    it is locked)."""
    for _ in range(50):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
                return con.execute(sql).fetchall()
        except sqlite3.OperationalError:
            time.sleep(0.05)
    raise AssertionError(f"cannot read {db}")


def _wait_rounds(tmp: Path, server: Proc, count: int, timeout: float = 60) -> int:
    """Wait until the store has ``count`` rounds recorded; how many it has then."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        db = _store_file(tmp)
        if db is not None:
            n = _query(db, "SELECT COUNT(*) FROM rounds")[0][0]
            if n >= count:
                return int(n)
        assert server.popen.poll() is None, server.log.read_text()
        time.sleep(0.01)
    raise AssertionError(f"fewer than {count} rounds in {timeout} s:\n{server.log.read_text()}")


def _participants(run_dir: Path) -> dict[int, set[int]]:
    """Each recorded round's clients whose update is in the model."""
    db = run_dir / "store.sqlite"
    out: dict[int, set[int]] = {r: set() for (r,) in _query(db, "SELECT round_idx FROM rounds")}
    for r, c in _query(db, "SELECT round_idx, client_id FROM client_rounds"):
        out[r].add(c)
    return out


def _skips(run_dir: Path) -> dict[int, str]:
    """Each skipped round's reason (the anomalies without a client)."""
    rows = _query(
        run_dir / "store.sqlite", "SELECT round_idx, reason FROM anomalies WHERE client_id IS NULL"
    )
    return dict(rows)


# ---------------------------------------------------------------- the simulator
class _Absent(SimulationEngine):
    """The simulator's engine without the clients ``gone(round, phase)`` names:
    they get no message of that phase, answer none, and do not train ("train")."""

    name = "absent"

    def __init__(self, inner: Any, gone: Callable[[int, str], set[int]]) -> None:
        self.inner, self.gone, self.round_idx = inner, gone, 0

    def begin_round(self, round_idx: int) -> None:
        self.round_idx = round_idx  # called as for a deployment engine

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        out = self.gone(self.round_idx, phase)
        return self.inner.run_phase(phase, {c: m for c, m in messages.items() if c not in out})

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        out = self.gone(tasks[0].round_idx, "train") if tasks else set()
        yield from self.inner.run_cohort([t for t in tasks if t.client_id not in out], payload)

    def close(self) -> None:
        close_engine(self.inner)


def _simulated(
    cfg_path: Path,
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    gone: Callable[[int, str], set[int]] | None = None,
    **changes: Any,
) -> RunResult:
    """The simulator's run of ``cfg_path`` (with ``changes``), on the serial engine
    the client processes train on, without the clients ``gone`` names."""
    cfg = config_mod.override(
        config_mod.load(cfg_path),
        {"runs_dir": str(tmp / f"sim-{time.monotonic_ns()}"), "engine": "serial", **changes},
    )
    with monkeypatch.context() as m:
        if gone is not None:
            real_build = loop.build

            def build(c: Any, d: Any = None, t: Any = None) -> Any:
                exp = real_build(c, d, t)
                exp.engine = _Absent(exp.engine, gone)
                return exp

            m.setattr(loop, "build", build)
        return run(cfg)


def _dead_from(ids: set[int], round_idx: int, phase: str) -> Callable[[int, str], set[int]]:
    """``ids`` gone from ``phase`` of round ``round_idx`` on (a later round: from
    its first phase)."""

    def gone(r: int, p: str) -> set[int]:
        late = r > round_idx or (r == round_idx and ORDER.index(p) >= ORDER.index(phase))
        return ids if late else set()

    return gone


# ---------------------------------------------------------------- the processes
def _clients(
    tmp: Path, port: int, monkeypatch: pytest.MonkeyPatch, exit_at: Mapping[str, str] | None = None
) -> dict[str, Proc]:
    """Client processes hosting 0-1, 2-3, 4-5; ``exit_at``: ids -> ROUND:PHASE."""
    procs = {}
    exit_at = exit_at or {}
    for ids in ("0-1", "2-3", "4-5"):
        with monkeypatch.context() as m:
            if ids in exit_at:
                m.setenv("FEDFORGE_TEST_EXIT_AT", exit_at[ids])
            procs[ids] = start_client(tmp, port, ids, "--insecure")
    return procs


def _finished(server: Proc, clients: Mapping[str, Proc], tmp: Path) -> Path:
    """The run's directory, once the server and the surviving clients ended well."""
    assert server.wait(120) == 0, server.log.read_text()
    for c in clients.values():
        code = c.wait(60)
        exited = any(e.get("event") == "test_exit" for e in c.events())
        assert code == (1 if exited else 0), c.log.read_text()
    return tmp / run_dir_of(server)


def _close(*procs: Proc) -> None:
    for p in procs:
        p.kill()


# test ports lie below the kernel's ephemeral range, in a block of their own per
# xdist worker: no process asking the kernel for any free port (a server
# started with --port 0) can take one while a test restarts its server on it,
# and two workers never pick the same one
PORT_BASE = 20_000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _port_block() -> tuple[int, int]:
    """This process's block of ports: its first and how many."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    index = (int(worker) if worker.isdigit() else 0) % workers  # a replaced worker: gwN, N >= count
    size = (_ephemeral_low() - PORT_BASE) // workers
    if size < 16:
        raise RuntimeError(
            f"{workers} test workers leave {size} ports each below the ephemeral range "
            f"({_ephemeral_low()}); run fewer workers (make test TEST_WORKERS=...)"
        )
    return PORT_BASE + index * size, size


_next_port = [random.randrange(1 << 16)]  # where this process's next search starts


def free_port() -> int:
    """A port free now, in this test process's own block; calls in turn give
    different ports (two asked for at once are two)."""
    low, size = _port_block()
    for _ in range(size):
        port = low + _next_port[0] % size
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{low + size - 1}")


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.dtype == b.dtype == torch.float64
    return float((a - b).abs().max())

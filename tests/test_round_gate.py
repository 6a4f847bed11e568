"""The round's one acting seam (server/hooks.py: ``RoundGate``): a package's own
gate decides which of a round's cohort are asked, exactly as if the others'
processes were gone; a user's hook cannot change who is asked, whatever it
defines or writes; a deployment's hooks hold the rollout (its gate) and the
alerts in the documented order; the ``recorded`` point comes once the round is
in the run store."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from deploy_procs import write_config
from deploy_sim import ALL, SECAGG, _simulated
from fedforge import config as config_mod
from fedforge.server.builtin_hooks import run_hooks
from fedforge.server.hooks import RoundHook, RoundInfo
from fedforge.server.loop import run
from fedforge.server.result import RunResult
from fedforge.transport.security import ServerSecurity
from fedforge.transport.serve import Deployment, ServerOptions, _served

pytestmark = pytest.mark.usefixtures("one_thread")

BUILTIN = ["privacy", "diagnostics", "client_state", "selection"]


class LeaveOut(RoundHook):
    """A gate that leaves ``out`` unasked, writing down what it was shown."""

    name = "leave_out"

    def __init__(self, out: set[int]) -> None:
        self.out = out
        self.shown: list[tuple[int, list[int]]] = []

    def askable(self, info: RoundInfo, ids: Sequence[int]) -> list[int]:
        self.shown.append((info.round_idx, list(ids)))
        return [c for c in ids if c not in self.out] + [99]  # 99: no such client


def _config(tmp: Path, name: str, **changes: Any) -> Path:
    """The deployment tests' six synthetic clients, all asked each round."""
    return write_config(tmp / f"{name}.yaml", client_fraction=1.0, **changes)


def _records(result: RunResult) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The run's round rows (without their wall time) and client rows."""
    assert result.run_dir is not None
    with sqlite3.connect(result.run_dir / "store.sqlite") as db:
        rounds = db.execute(
            "SELECT round_idx, cohort_size, train_loss, test_accuracy, test_loss, bytes_up, "
            "bytes_down, lr FROM rounds ORDER BY round_idx"
        ).fetchall()
        clients = db.execute("SELECT * FROM client_rounds ORDER BY round_idx, client_id").fetchall()
    return rounds, clients


def _run(path: Path, tmp: Path, hooks: Any = ()) -> RunResult:
    """The simulator's run of ``path`` on the serial engine, as ``_simulated`` runs it."""
    runs = str(tmp / f"gated-{time.monotonic_ns()}")
    cfg = config_mod.override(config_mod.load(path), {"runs_dir": runs, "engine": "serial"})
    return run(cfg, hooks=hooks)


@pytest.mark.parametrize("extra", [{}, SECAGG], ids=["plain", "secagg"])
def test_a_gate_asks_the_round_as_if_the_others_were_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    """Client 2 left out by a built-in gate: the records and model are those of the
    simulator whose engine never reaches client 2 (no protocol message, no task),
    client 2 is still in every cohort (a dropout), and a gate cannot add a client."""
    path = _config(tmp_path, "cfg", **extra)
    gate = LeaveOut({2})
    gated = _run(path, tmp_path, run_hooks(gates=[gate]))
    gone = _simulated(path, tmp_path, monkeypatch, gone=lambda r, phase: {2})
    assert torch.equal(gated.params, gone.params)
    rounds, clients = _records(gated)
    assert (rounds, clients) == _records(gone)
    assert [r[1] for r in rounds] == [6, 6, 6]  # asked: the whole cohort
    assert sorted({(r, c) for r, c, *_ in clients}) == [
        (r, c) for r in range(3) for c in sorted(ALL - {2})
    ]
    assert gate.shown == [(r, sorted(ALL)) for r in range(3)]


class Meddler(RoundHook):
    """A user's hook that tries to change who is asked: empties the round's lists
    it is shown and, were it asked, would let nobody train."""

    name = "meddler"

    def __init__(self) -> None:
        self.asked = 0

    def round_start(self, info: RoundInfo) -> None:
        info.cohort.clear()
        info.trainers.clear()

    def askable(self, info: RoundInfo, ids: Sequence[int]) -> list[int]:
        self.asked += 1
        return []


def test_a_users_hook_cannot_change_who_is_asked(tmp_path: Path) -> None:
    path = _config(tmp_path, "cfg")
    meddler, gate = Meddler(), LeaveOut({2})
    plain = _run(path, tmp_path)
    meddled = _run(path, tmp_path, [meddler, gate])  # a gate handed in as a user's hook
    assert meddler.asked == 0 and gate.shown == []
    assert torch.equal(plain.params, meddled.params)
    assert _records(plain) == _records(meddled)
    # in a deployment's list too, a user's hook joins after the gates, never as one
    chain = run_hooks([meddler], gates=[gate])
    assert chain.gates == (gate,) and chain.names() == [*BUILTIN, "leave_out", "alerts", "meddler"]
    assert chain.extended([Reader()]).gates == (gate,)


def test_a_deployment_holds_the_rollout_and_the_alerts_in_order(tmp_path: Path) -> None:
    cfg = _served(config_mod.load(write_config(tmp_path / "cfg.yaml")))
    dep = Deployment(cfg, ServerOptions(ServerSecurity("insecure"), port=0))
    dep.start()
    try:
        hooks = dep.hooks()
        assert hooks.names() == [*BUILTIN, "rollout", "alerts"]
        assert hooks.gates == (dep.rollout,)
        assert not hasattr(dep.engine, "rollout")  # the engine only moves the work
    finally:
        dep.stop("the test is over", dismiss=False)
    simulator = run_hooks()  # the simulator's: no rollout, no gate
    assert simulator.names() == [*BUILTIN, "alerts"] and simulator.gates == ()


class Reader(RoundHook):
    """At ``recorded``: the rounds the store holds then."""

    name = "reader"

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[int]]] = []

    def recorded(self, info: RoundInfo) -> None:
        assert info.store is not None
        self.seen.append((info.round_idx, [r.round_idx for r in info.store.rounds()]))


def test_recorded_comes_once_the_round_is_in_the_store(tmp_path: Path) -> None:
    reader = Reader()
    _run(_config(tmp_path, "cfg"), tmp_path, [reader])
    assert reader.seen == [(r, list(range(r + 1))) for r in range(3)]
    without = Reader()  # a run without a store: nothing is recorded
    cfg = config_mod.override(config_mod.load(_config(tmp_path, "cfg")), {"engine": "serial"})
    run(cfg, store=False, hooks=[without])
    assert without.seen == []


def test_a_resumed_deployments_rollout_asks_only_the_new_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollout hook reads the store it is first shown: clients 0 and 1 reported
    their cold start before the resume, so only client 2 is asked to evaluate, its
    row goes to the round's outputs, and the gate then lets 0, 1 and 2 be asked
    (3 never joined); a local round asks nothing."""
    from types import SimpleNamespace

    from fedforge.config import Config, override
    from fedforge.store import RunStore
    from fedforge.transport.hub import Hub
    from fedforge.transport.rollout import Rollout

    cfg = override(Config(), {"deployment.cold_start": True, "runs_dir": str(tmp_path)})
    store = RunStore.create(tmp_path, cfg)
    store.record_rows("cold_start", 0, [(0, 0, 0.5, 1.0, 10), (0, 1, 0.25, 2.0, 10)])
    hub = Hub(4, 30.0)
    hub.join("a", [(0, 10), (1, 10), (2, 10)])
    rollout = Rollout(hub, cfg)
    asked: list[list[int]] = []

    def evaluate(ids: list[int], payload: bytes, pid: str, label: str, r: int) -> dict[int, Any]:
        asked.append(list(ids))
        return {c: {"accuracy": 0.75, "loss": 0.5, "num_examples": 10.0} for c in ids}

    monkeypatch.setattr(rollout, "evaluate", evaluate)

    def info(kind: str) -> RoundInfo:
        state = SimpleNamespace(outputs={})
        params = torch.zeros(3)
        cohort = [0, 1, 2, 3]
        return RoundInfo(None, state, None, 1, 1, kind, cohort, [], params, store=store)

    local = info("local")
    rollout.round_start(local)
    assert asked == [] and local.state.outputs == {}
    upload = info("upload")
    rollout.round_start(upload)
    assert asked == [[2]]
    assert upload.state.outputs == {"cold_start": [(1, 2, 0.75, 0.5, 10)]}
    assert rollout.askable(upload, [0, 1, 2, 3]) == [0, 1, 2]
    store.close()

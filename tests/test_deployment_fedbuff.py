"""FedBuff over the network: real ``fedforge server`` and client processes on
loopback, client 1 slowed on purpose (``--slowdown``). The server keeps M = 2
clients at work and steps at every K = 2 updates; the slow client's updates
arrive stale and are weighted (or refused past ``asynchronous.max_staleness``);
a server killed mid-run resumes from its checkpoint and takes only the work it
handed out itself. Arrival order is the machine's, so the checks are of the
server's records against its own event log, not against fixed numbers."""

from __future__ import annotations

import math
import signal
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from deploy_procs import Proc, run_dir_of, start_client, start_server, write_config
from deploy_sim import _close, _query, _store_file, _wait_rounds, deploy_env, free_port
from fedforge.store.checkpoint import list_checkpoints, load_checkpoint
from fedforge.store.final import load_final
from fedforge.transport.ids import parse_ids

pytestmark = pytest.mark.usefixtures("deploy_env")
assert deploy_env  # the fixture is used by name
STEPS = 12
SLOW = "1"


def _config(tmp: Path, **asyn: Any) -> Path:
    return write_config(
        tmp / "cfg.yaml",
        dataset="regression",
        model="linear",
        num_clients=3,
        client_fraction=1.0,
        rounds=STEPS,
        local_epochs=5,
        robust={"max_norm_multiple": None},
        asynchronous={"mode": "fedbuff", "concurrency": 2, "buffer_size": 2, **asyn},
    )


def _clients(tmp: Path, port: int) -> list[Proc]:
    return [
        start_client(tmp, port, c, "--insecure", *(("--slowdown", "10") if c == SLOW else ()))
        for c in "012"
    ]


def _run(tmp: Path, **asyn: Any) -> tuple[Proc, Path]:
    server, port = start_server(tmp, _config(tmp, **asyn), "--insecure")
    clients = _clients(tmp, port)
    try:
        assert server.wait(120) == 0, server.log.read_text()
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        _close(server, *clients)
    return server, run_dir_of(server)


def _events(server: Proc, name: str) -> list[dict[str, Any]]:
    return [e for e in server.events() if e.get("event") == name]


def _check_versions(server: Proc) -> list[dict[str, Any]]:
    """Each update's version is the one the server's log says it handed that
    client last, its staleness the steps since; its updates in that order."""
    handed: dict[int, list[int]] = {}
    for e in server.events():
        if e.get("event") == "buffered_work":
            for c in parse_ids(e["clients"]):
                handed.setdefault(c, []).append(e["version"])
        elif e.get("event") == "buffered_update":
            c = e["client"]
            assert handed[c] and e["version"] == handed[c].pop(0), e
            assert e["staleness"] == e["step"] - 1 - e["version"] >= 0, e
    return _events(server, "buffered_update")


def _table(run_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        return db.execute(sql).fetchall()


@pytest.mark.slow
def test_a_slowed_client_arrives_stale_and_is_asked_less(tmp_path: Path) -> None:
    """Twelve steps of two updates each. Per step, the store's ``buffered_rounds``
    (updates taken, mean and largest staleness) equals the count from the
    event log's taken updates; the slow client's updates come staler than the
    fast ones' (a stale one taken is in its step's row), and it is handed work
    fewer times than either fast client."""
    server, run_dir = _run(tmp_path)
    updates = _check_versions(server)
    rows = _table(run_dir, "SELECT * FROM buffered_rounds ORDER BY round_idx")
    assert [r[0] for r in rows] == list(range(STEPS))
    for r, seconds, count, mean, most in rows:
        taken = [e["staleness"] for e in updates if e["step"] == r + 1 and e["taken"]]
        assert count == len(taken) == 2
        assert math.isclose(mean, sum(taken) / 2) and most == max(taken)
        assert seconds > 0
    assert [r[1] for r in rows] == sorted(r[1] for r in rows)  # the run's clock goes on
    slow = [e["staleness"] for e in updates if e["client"] == int(SLOW)]
    fast = [e["staleness"] for e in updates if e["client"] != int(SLOW)]
    assert slow and max(slow) >= 1 and sum(slow) / len(slow) > sum(fast) / len(fast)
    stale_taken = {e["step"] - 1 for e in updates if e["taken"] and e["staleness"] >= 1}
    assert stale_taken and all(rows[r][4] >= 1 for r in stale_taken)
    asked = Counter(c for e in _events(server, "buffered_work") for c in parse_ids(e["clients"]))
    assert asked[int(SLOW)] < min(asked[0], asked[2])
    assert len(_table(run_dir, "SELECT * FROM rounds")) == STEPS


@pytest.mark.slow
def test_max_staleness_0_refuses_the_slowed_clients_updates_with_the_reason(
    tmp_path: Path,
) -> None:
    """Every stale update is refused, its reason among the run's anomalies; every
    step takes two fresh ones."""
    server, run_dir = _run(tmp_path, max_staleness=0)
    updates = _check_versions(server)
    stale = [e for e in updates if e["staleness"] > 0]
    assert any(e["client"] == int(SLOW) for e in stale)
    for e in stale:
        assert not e["taken"]
        assert e["reason"] == (
            f"client {e['client']}'s update refused: it is {e['staleness']} server steps "
            "stale, more than asynchronous.max_staleness = 0"
        )
    anomalies = _table(run_dir, "SELECT round_idx, client_id, reason FROM anomalies")
    assert sorted(anomalies) == sorted((e["step"] - 1, e["client"], e["reason"]) for e in stale)
    rows = _table(run_dir, "SELECT updates, staleness_max FROM buffered_rounds")
    assert rows == [(2, 0)] * STEPS


@pytest.mark.slow
def test_a_server_killed_mid_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """SIGKILL once four steps are recorded (checkpoint_every 1), then ``fedforge
    server --resume``: the run ends with each step recorded once, the clock
    going on from the checkpoint's time, a loadable last checkpoint, and the
    resumed server took only updates of work it handed out itself (the work
    out at the kill is no question of its)."""
    port = free_port()
    server, _ = start_server(tmp_path, _config(tmp_path), "--insecure", "--port", str(port))
    clients = _clients(tmp_path, port)
    resumed: Proc | None = None
    try:
        _wait_rounds(tmp_path, server, 4)
        server.kill(signal.SIGKILL)
        db = _store_file(tmp_path)
        assert db is not None
        kept = _query(db, "SELECT COUNT(*) FROM rounds")[0][0]
        assert 4 <= kept < STEPS
        resumed, _ = start_server(
            tmp_path, None, "--insecure", "--port", str(port), "--resume", str(db.parent)
        )
        assert resumed.wait(120) == 0, resumed.log.read_text()
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        _close(server, *clients, *([resumed] if resumed else []))
    run_dir = run_dir_of(resumed)
    assert run_dir == db.parent
    assert [r for (r,) in _table(run_dir, "SELECT round_idx FROM rounds ORDER BY round_idx")] == (
        list(range(STEPS))
    )
    times = [t for (t,) in _table(run_dir, "SELECT virtual_time FROM buffered_rounds")]
    assert len(times) == STEPS and times == sorted(times)
    handed = {e["version"] for e in _events(resumed, "buffered_work")}
    after = _events(resumed, "buffered_update")
    assert after and all(e["version"] in handed for e in after)
    first = min(e["step"] for e in after)
    assert min(handed) == first - 1 >= 4 - 1  # from the checkpoint's model on
    ckpts = [load_checkpoint(path) for path in list_checkpoints(run_dir)]
    assert max(c.next_round for c in ckpts) > kept  # the resumed run's own
    assert all(c.in_flight == {} for c in ckpts)  # work out on the network is not kept
    assert torch.isfinite(load_final(run_dir)["params"]).all()

"""Dead clients and honest accounting, with real processes on loopback: a client
process killed by SIGKILL leaves the live set long before the heartbeat
timeout and is no longer sampled; the run store records the bytes that crossed
the wire (the server's own counters, and one payload a completed download); the
server says who has joined while it waits; secure and private configs start
with the deployment's defaults."""

from __future__ import annotations

import re
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deploy_procs import Proc, run_dir_of, start_client, start_server, write_config
from deploy_sim import _participants, _skips, deploy_env
from fedforge.report.dashboard.data import round_rows
from fedforge.report.headline import headline
from fedforge.store import RunStore
from fedforge.store.live_state import read_live_state

pytestmark = pytest.mark.usefixtures("deploy_env")
assert deploy_env  # the fixture is used by name


def _event(proc: Proc, pred: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for e in proc.events():
            if pred(e):
                return e
        time.sleep(0.05)
    raise AssertionError(f"no such event:\n{proc.log.read_text()}")


def _rounds(tmp: Path) -> int:
    for db in (tmp / "runs").glob("[!.]*/store.sqlite"):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])
        except sqlite3.OperationalError:  # being created
            pass
    return 0


def _connected(tmp: Path) -> list[int] | None:
    for path in (tmp / "runs").glob("[!.]*/live.json"):
        state = read_live_state(path.parent)
        if state is not None:
            return list(state["connected"])
    return None


@pytest.mark.slow
def test_the_server_says_who_joined_while_it_waits(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", rounds=1)
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, "0-2", "--insecure")]
    try:
        first = _event(server, lambda e: e.get("event") == "joining", 30)
        assert re.fullmatch(
            r"0 of 6 joined; waiting for ids 0-5 until \d\d:\d\d", first["message"]
        ), first
        half = _event(server, lambda e: e.get("event") == "joining" and e["joined"] == 3, 60)
        assert re.fullmatch(
            r"3 of 6 joined; waiting for ids 3-5 until \d\d:\d\d", half["message"]
        ), half
        clients.append(start_client(tmp_path, port, "3-5", "--insecure"))
        assert server.wait(120) == 0, server.log.read_text()
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        for p in (server, *clients):
            p.kill()


def test_a_killed_process_leaves_sampling_and_the_bytes_are_those_sent(tmp_path: Path) -> None:
    """Three processes host two clients each, three clients a round, a 30 s
    heartbeat timeout. SIGKILL to one once two rounds are recorded: its clients
    leave the live set within seconds, at most one round (the one it died in)
    misses an asked client, and every later round has its three. Each round's
    bytes down are one payload per download completed (the first round's three
    give the payload's size), and the store's totals are the server's counters."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        rounds=10,
        deployment={"heartbeat_timeout_s": 30},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    procs = {ids: start_client(tmp_path, port, ids, "--insecure") for ids in ("0-1", "2-3", "4-5")}
    try:
        end = time.monotonic() + 120
        while _rounds(tmp_path) < 2 and time.monotonic() < end:
            time.sleep(0.02)
        killed = time.monotonic()
        procs.pop("2-3").kill(signal.SIGKILL)
        while (live := _connected(tmp_path)) is None or {2, 3} & set(live):
            assert time.monotonic() - killed < 10, live  # not the 30 s heartbeat timeout
            time.sleep(0.02)
        assert server.wait(120) == 0, server.log.read_text()
        for c in procs.values():
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        for p in (server, *procs.values()):
            p.kill()
    run_dir = tmp_path / run_dir_of(server)
    got = _participants(run_dir)
    short = [r for r in range(10) if len(got.get(r, ())) < 3]
    assert len(short) <= 1, got  # the round it died in, if it was asked then
    assert all(got[r] <= {0, 1, 4, 5} for r in range(10) if r > max(short, default=1)), got
    assert set(_skips(run_dir)) <= set(short)
    finished = _event(server, lambda e: e.get("event") == "finished", 1)
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        rows = db.execute("SELECT round_idx, bytes_up, bytes_down FROM rounds").fetchall()
        taken = db.execute("SELECT round_idx, SUM(bytes_up) FROM client_rounds GROUP BY 1")
        up_by_round = dict(taken.fetchall())
    payload = rows[0][2] // 3
    assert rows[0][2] == 3 * payload > 0
    for r, up, down in rows:
        n = len(got.get(r, ()))
        assert down % payload == 0 and n <= down // payload <= 3, (r, down, n)
        if r not in short:
            assert down == n * payload and up == up_by_round[r]
    assert sum(r[2] for r in rows) == finished["wire_bytes_down"]
    assert sum(r[1] for r in rows) == finished["wire_bytes_up"]
    # what `show`, the report and compare (the headline) and the dashboard show
    with RunStore.open(run_dir, read_only=True) as store:
        records = store.rounds()
    head = headline(records, None)
    assert (head.bytes_up, head.bytes_down) == (
        finished["wire_bytes_up"],
        finished["wire_bytes_down"],
    )
    shown = round_rows(records)
    assert sum(r["bytes_down"] for r in shown) == finished["wire_bytes_down"]


@pytest.mark.parametrize(
    "privacy",
    [
        {"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}},
        {"privacy": {"dp": "local", "noise_multiplier": 0.5}},
    ],
    ids=["secagg", "local-dp"],
)
def test_secure_and_private_configs_start_with_the_deployment_defaults(
    tmp_path: Path, privacy: dict[str, Any]
) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", **privacy)
    server, _ = start_server(tmp_path, cfg, "--insecure")  # listening: the config was taken
    server.kill()
    assert "cold_start" not in server.log.read_text()

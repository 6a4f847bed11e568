"""The deployment server's live-state file (``store/live_state.py``, written by
``transport/live.py``): replaced whole, read back tolerating absence and damage,
written at most a few times a second however many events, and written by a
real ``fedforge server`` with what its clients and its store say."""

from __future__ import annotations

import json
import sqlite3
import stat
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from deploy_procs import run_dir_of, start_client, start_server, write_config
from fedforge.store.live_state import LIVE_NAME, read_live_state, write_live_state
from fedforge.transport.hub import Hub
from fedforge.transport.live import LivePublisher


def test_written_whole_and_read_back(tmp_path: Path) -> None:
    assert read_live_state(tmp_path) is None  # no server ran here
    write_live_state(tmp_path, {"phase": "round 2: training", "joined": [0, 3], "x": float("nan")})
    assert read_live_state(tmp_path) == {
        "version": 1,
        "phase": "round 2: training",
        "joined": [0, 3],
        "x": None,
    }
    assert [p.name for p in tmp_path.iterdir()] == [LIVE_NAME]  # no temporary file left
    assert stat.S_IMODE((tmp_path / LIVE_NAME).stat().st_mode) == 0o644


def test_a_damaged_file_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / LIVE_NAME
    for text in ('{"phase": "round 2: tra', "[1, 2]", "", "\udcff"):
        path.write_text(text, errors="surrogateescape")
        assert read_live_state(tmp_path) is None, text
    path.write_bytes(b"\xff\xfe{")
    assert read_live_state(tmp_path) is None


def test_a_burst_of_refusals_is_few_writes_that_count_them_all(tmp_path: Path) -> None:
    hub = Hub(num_clients=4, heartbeat_timeout_s=30.0)
    live = LivePublisher(hub, "127.0.0.1:1", min_interval_s=0.2, refresh_s=60.0)
    hub.on_change = live.changed
    live.start()
    live.bind(tmp_path)
    burst = time.monotonic()
    for k in range(300):
        live.refused(f"client {k % 4} was not asked for a update in round 3 now")
    hub.join("a", [(0, 5), (1, 5)])
    time.sleep(0.7)
    seconds = time.monotonic() - burst
    state = read_live_state(tmp_path)
    assert state is not None
    assert state["refused"] == {"not_asked": 300}
    assert state["joined"] == [0, 1] and state["connected"] == [0, 1]
    assert 1 <= live.writes <= 1 + seconds / 0.2 + 1  # at most one per interval
    live.close("the run ended")
    final = read_live_state(tmp_path)
    assert final is not None and final["serving"] is False and final["phase"] == "the run ended"


def test_the_publisher_never_blocks_the_hub(tmp_path: Path) -> None:
    """The hub calls it under its lock: a folder that cannot be written costs
    nothing there, and the run goes on."""
    hub = Hub(num_clients=2, heartbeat_timeout_s=30.0)
    live = LivePublisher(hub, "127.0.0.1:1", min_interval_s=0.01)
    hub.on_change = live.changed
    live.start()
    live.bind(tmp_path / "gone")  # no such folder: every write fails
    took = time.monotonic()
    for _ in range(200):
        hub.set_phase("round 1: training")
    assert time.monotonic() - took < 0.5
    live.close("the server stopped")
    assert live.writes == 0 and not (tmp_path / "gone").exists()


def _watch(runs: Path, seen: list[dict], stop: threading.Event) -> None:
    """Every state of the live-state file of the run under ``runs`` as it changes."""
    while not stop.is_set():
        for path in runs.glob(f"*/{LIVE_NAME}"):
            state = read_live_state(path.parent)
            if state is not None and (not seen or state != seen[-1]):
                seen.append(state)
        time.sleep(0.02)


@pytest.mark.slow
def test_a_deployment_server_publishes_its_live_state(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", rounds=3)
    seen: list[dict] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(tmp_path / "runs", seen, stop))
    watcher.start()
    try:
        server, port = start_server(tmp_path, cfg, "--insecure")
        clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
        assert server.wait(180) == 0, server.log.read_text()
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        stop.set()
        watcher.join()
    run_dir = tmp_path / run_dir_of(server)
    final = json.loads((run_dir / LIVE_NAME).read_text())
    assert final["serving"] is False and final["phase"] == "the run ended"
    assert final["joined"] == list(range(6)) and final["num_clients"] == 6
    assert final["address"] == f"127.0.0.1:{port}"
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        updates, up = db.execute("SELECT COUNT(*), SUM(bytes_up) FROM client_rounds").fetchone()
        down = db.execute("SELECT SUM(bytes_down) FROM rounds").fetchone()[0]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    # every answer the server took is an update in the store (no cold start by default)
    assert final["accepted"] == updates and "cold_start" not in tables
    assert final["bytes_up"] == up and final["bytes_down"] == down
    assert final["dropouts"] == 0 and final["refused"] == {}
    # the states while serving may all fall in one throttled write that a watcher on
    # a loaded machine misses (a 3-round run lasts about a second): the states as
    # they move are followed through a real hub in tests/test_dashboard_browser.py
    assert seen and seen[-1] == final


def test_the_dashboard_shows_clients_as_counts_and_ranges_at_any_scale() -> None:
    from fedforge.report.dashboard.data import live_view

    state = {"num_clients": 100, "connected": [*range(25), 30, *range(50, 100)]}
    view = live_view({**state, "joined": list(range(100)), "serving": True, "updated": 0.0}, 1.0)
    assert view is not None
    assert view["connected_text"] == "76 of 100: 0-24, 30, 50-99"
    assert view["joined_text"] == "100 of 100: 0-99"
    assert view["away_text"] == "24: 25-29, 31-49"
    # 10,000 clients, every other one connected: a short line, the rest counted
    many = {"num_clients": 10_000, "connected": list(range(0, 10_000, 2)), "joined": []}
    big = live_view(many, 1.0)
    assert big is not None
    assert big["connected_text"] == (
        "5,000 of 10,000: 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, and 4,988 more ranges"
    )
    assert big["away_text"].startswith("5,000: 1, 3, 5,") and len(big["away_text"]) < 120
    assert big["joined_text"] == "0 of 10,000: -"
    # the most clients a config takes: the counts come from the ids' runs, not
    # from a set of every client (seconds and a gigabyte a view, once a second)
    most = {"num_clients": 10_000_000, "connected": [*range(10), 500], "joined": []}
    tracemalloc.start()
    try:
        huge = live_view(most, 1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert huge is not None and peak < 1 << 20, f"{peak:,} bytes at the peak"
    assert huge["away_text"] == "9,999,989: 10-499, 501-9999999"
    odd = live_view({"connected": "all", "joined": [1, True, "2"]}, 1.0)  # a hand-made file
    assert odd is not None and odd["connected_text"] == "0 of ?: -" and "away_text" not in odd
    assert odd["joined_text"] == "1 of ?: 1"


def test_the_dashboard_names_twenty_kinds_of_refusal_then_counts_the_rest() -> None:
    """A client may choose the text of its refusals (a codec's name it sent): the
    page names the 20 most frequent kinds, then one row counts the others, as the
    report's table does; numbers count as one kind."""
    from fedforge.report.dashboard.data import anomaly_view
    from fedforge.store.records import AnomalyRecord

    chosen = [AnomalyRecord(0, 1, f"codec 'c{chr(97 + i)}' is not the run's") for i in range(25)]
    norms = [AnomalyRecord(r, 2, f"update norm {r}.5 exceeds the bound 1.0") for r in range(30)]
    view = anomaly_view([*chosen, *norms, AnomalyRecord(3, None, "no valid update")])
    rows = [(g["reason"], g["count"]) for g in view["by_reason"]]
    assert rows[0] == ("update norm # exceeds the bound #", 30)
    assert len(rows) == 21 and rows[-1] == ("6 other reasons", 6)
    assert sum(n for _, n in rows) == view["refused"] == 55
    assert view["clients"] == 2 and view["skipped_rounds"] == 1
    few = anomaly_view(chosen[:3])
    assert [g["count"] for g in few["by_reason"]] == [1, 1, 1]  # all named, no count row

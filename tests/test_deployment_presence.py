"""Availability measured in a deployment: real ``fedforge server`` and client
processes on loopback, one client process killed mid-run and started again;
the server's ``presence`` rows show its two spells, the rounds waiting for it
meanwhile, and ``fedforge profile`` derives its mean offline spell from them."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from deploy_procs import run_dir_of, start_client, start_server, write_config
from fedforge.cli import main
from fedforge.systems import read_profiles
from test_deployment import _wait_for_round


@pytest.mark.slow
def test_a_client_killed_and_started_again_has_its_offline_spell_in_the_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three clients, every round needs all three (``robust.min_clients``), so
    while client 2 is away a round waits for it (``deployment.live_wait_s``).
    Client 2's process is killed after round 2 (its connection closes: gone at
    once) and started again. Its rows: a spell ended by its leaving, then one
    to the run's end; the profile's mean online spell is its seconds online
    over its one departure, the mean offline one the gap between the spells,
    which lies within the test's own clock from the kill to the run's end.
    Clients 0 and 1 stayed: always online."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        dataset="regression",
        model="linear",
        num_clients=3,
        client_fraction=1.0,
        rounds=6,
        robust={"min_clients": 3},
        deployment={"live_wait_s": 120},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, str(c), "--insecure") for c in range(3)]
    back = None
    try:
        _wait_for_round(tmp_path, 2)
        killed = time.monotonic()
        clients[2].kill()
        back = start_client(tmp_path, port, "2", "--insecure")
        assert server.wait(240) == 0, server.log.read_text()
        ended = time.monotonic()
        for c in (clients[0], clients[1], back):
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        for p in (server, *clients, *([back] if back else [])):
            p.kill()
    run_dir = tmp_path / run_dir_of(server)
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        spells = db.execute("SELECT * FROM presence ORDER BY client_id, since").fetchall()
        (watch,) = db.execute("SELECT since, until FROM presence_watch").fetchall()
        rounds = db.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]
    assert rounds == 6
    mine = [s for s in spells if s[0] == 2]
    assert [s[3] for s in mine] == [1, 0] and all(s[4] == 0 for s in mine)  # left, then there
    assert [s[0] for s in spells if s[0] != 2] == [0, 1] and all(
        s[3] == 0 and s[4] == 0 for s in spells if s[0] != 2
    )
    gap = mine[1][1] - mine[0][2]
    assert 0 < gap <= ended - killed
    online = sum(s[2] - s[1] for s in mine)

    out = tmp_path / "pop.csv"
    capsys.readouterr()
    assert main(["profile", str(run_dir), "--out", str(out)]) == 0
    profiles = read_profiles(out, 3)
    assert profiles[2].mean_online_s == pytest.approx(online, rel=1e-12)
    assert profiles[2].mean_offline_s == pytest.approx(gap, rel=1e-12)
    assert profiles[0].always_online and profiles[1].always_online
    assert watch[0] <= mine[0][1] and mine[1][2] <= watch[1]

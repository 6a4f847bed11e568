"""Profile a deployment, then simulate it: real ``fedforge server`` and client
processes on loopback, one client slowed on purpose (``--slowdown``) and one
lying about its times; the server's ``client_times`` and ``client_work`` rows,
then ``fedforge profile RUN`` read back and loaded by a simulation's config."""

from __future__ import annotations

import math
import sqlite3
import statistics
import sys
from pathlib import Path

import pytest

from deploy_procs import run_dir_of, start_client, start_process, start_server, write_config
from fedforge import config as config_mod
from fedforge.cli import main
from fedforge.selection.history import History
from fedforge.server.experiment import build
from fedforge.store.checkpoint import list_checkpoints, load_checkpoint
from fedforge.systems import population, read_profiles

LIAR = Path(__file__).with_name("timing_liar.py")
SLOWDOWN = 4.0
EPOCHS = 5


def _rows(run_dir: Path, table: str) -> list[tuple]:
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        return db.execute(f"SELECT * FROM {table} ORDER BY round_idx, client_id").fetchall()


@pytest.mark.slow
def test_a_deployments_profile_shows_the_slowed_client_and_a_simulation_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three clients of 200 examples each, all asked every round: 0 as it is, 1
    four times slower (each training followed by three times its own time
    asleep), 2 reporting a training of 10^6 s. Client 1's derived speed is a
    quarter of client 0's: the same work (five epochs of 200 examples, the same
    fixed costs) on the same machine, times 4. Within a factor 2 of 4 either
    way: each round's training takes tens of milliseconds, which the load of a
    shared machine stretches at random (the median of four rounds damps it)."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        dataset="regression",
        model="linear",
        num_clients=3,
        client_fraction=1.0,
        rounds=4,
        local_epochs=EPOCHS,
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    fast = start_client(tmp_path, port, "0", "--insecure")
    slow = start_client(tmp_path, port, "1", "--insecure", "--slowdown", str(SLOWDOWN))
    liar = start_process(tmp_path, "liar", [sys.executable, str(LIAR), f"127.0.0.1:{port}", "2"])
    try:
        assert server.wait(180) == 0, server.log.read_text()
        for c in (fast, slow, liar):
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        for p in (server, fast, slow, liar):
            p.kill()
    run_dir = tmp_path / run_dir_of(server)
    times, work = _rows(run_dir, "client_times"), _rows(run_dir, "client_work")
    assert [(r, c) for r, c, *_ in times] == [(r, c) for r in range(4) for c in range(3)]
    assert all(arrived == 1 for *_, arrived in times)

    # the honest clients' three parts add up to the server's total; the liar's
    # report is refused whole (its total kept), with the reason in the log
    for _, c, down, compute, up, total, _ in times:
        if c == 2:
            assert (down, compute, up) == (None, None, None) and total > 0
        else:
            assert min(down, compute, up) >= 0
            assert math.isclose(down + compute + up, total, rel_tol=1e-9)
    refused = [e for e in server.events() if e.get("event") == "times_refused"]
    assert [e["client"] for e in refused] == [2] * 4
    assert "train_s = 1e+06 add up to more than the" in refused[0]["reason"]

    # the work: epochs x the partition's sizes; the bytes the rounds counted
    exp = build(config_mod.load(cfg))
    sizes = [exp.data.num_examples(c) for c in range(3)]
    assert [w[2] for w in work] == [EPOCHS * sizes[c] for _ in range(4) for c in range(3)]
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        rounds = db.execute("SELECT bytes_up, bytes_down FROM rounds ORDER BY round_idx").fetchall()
    for r, (up, down) in enumerate(rounds):
        mine = [w for w in work if w[0] == r]
        assert sum(w[4] for w in mine) == up and sum(w[3] for w in mine) == down

    # the selection history's last durations: the checkpointed round's totals
    ckpt = load_checkpoint(list_checkpoints(run_dir)[0])
    history = History.from_state(ckpt.loop["selection"]).rows
    last = [t[5] for t in times if t[0] == ckpt.next_round - 1]
    assert [history[c]["last_duration_s"] for c in range(3)] == last

    out = tmp_path / "pop.csv"
    capsys.readouterr()
    assert main(["profile", str(run_dir), "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "clients 2: no training time measured; samples_per_s is the measured" in said.err
    profiles = read_profiles(out, 3)
    speed = {
        c: statistics.median(w[2] / t[3] for t, w in zip(times, work, strict=True) if t[1] == c)
        for c in (0, 1)
    }
    assert [profiles[c].samples_per_s for c in (0, 1)] == [speed[0], speed[1]]
    ratio = speed[0] / speed[1]
    assert SLOWDOWN / 2 <= ratio <= SLOWDOWN * 2, (speed, ratio)
    assert profiles[2].samples_per_s == statistics.median([speed[0], speed[1]])
    assert all(p.failure_prob == 0.0 and p.always_online for p in profiles)

    # a simulation of the same federation reads the profile through its config
    sim = config_mod.override(config_mod.load(cfg), {"systems": {"profiles": str(out)}})
    assert population(sim) == profiles

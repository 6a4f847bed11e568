"""Faults of a deployment, with real processes on loopback: a client process
killed mid-run is a dropout and the run goes on without it, and so is one that
dies and is restarted within a round, for that round (its closed connection ends
the wait at once); secure aggregation over
the wire ends where the simulator ends, recovers the masks of the clients that
died in a round when at least t survive, and skips the round (never a wrong
sum) when fewer do; a server killed by SIGKILL resumes from its run store with
``fedforge server --resume`` and ends where an uninterrupted run ends.

Each expected model is an in-process simulator run of the same config, on an
engine without the clients the deployment lost, from the round and phase it lost
them (``_Absent``): float64, to 1e-9 (the server sums the updates in the order
they arrive, the simulator in client order).

Where a client must die at an exact phase, its process is started with
FEDFORGE_TEST_EXIT_AT="ROUND:PHASE" (transport/client_options.py: it exits, answering
nothing, when handed that work); the first test kills a process with SIGKILL
at whatever point of the run it is, and reads from the run store what followed.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from deploy_procs import Proc, start_client, start_server, write_config
from deploy_sim import (
    ALL,
    QUIET,
    SECAGG,
    _clients,
    _close,
    _dead_from,
    _finished,
    _max_diff,
    _participants,
    _query,
    _simulated,
    _skips,
    _store_file,
    _wait_rounds,
    deploy_env,
    free_port,
)
from fedforge.store.final import load_final

pytestmark = pytest.mark.usefixtures("deploy_env")
assert deploy_env  # the fixture is used by name


# ---------------------------------------------------------------- the tests
@pytest.mark.slow
def test_a_killed_client_process_is_a_dropout_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL to the process hosting clients 2 and 3 once the first of 8 rounds
    is recorded: the server notices the silence within the heartbeat timeout (not
    the 60 s deadline), every round after the kill aggregates exactly the four
    surviving clients, and the model is the simulator's over the clients the
    store says each round aggregated."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        client_fraction=1.0,
        rounds=8,
        deployment={"heartbeat_timeout_s": 2},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = _clients(tmp_path, port, monkeypatch)
    try:
        _wait_rounds(tmp_path, server, 1)
        clients["2-3"].kill(signal.SIGKILL)
        assert clients["2-3"].popen.returncode == -signal.SIGKILL
        del clients["2-3"]
        run_dir = _finished(server, clients, tmp_path)
    finally:
        _close(server, *clients.values())
    got = _participants(run_dir)
    assert sorted(got) == list(range(8))
    # the first round without all six is the one the kill fell in (clients 2 and 3
    # train one after the other: one of them may have answered it)
    kill = min(r for r, ids in got.items() if ids != ALL)
    assert 1 <= kill < 7, got  # a round of the run after it, to check
    assert all(got[r] == ALL for r in range(kill))
    assert {0, 1, 4, 5} <= got[kill] < ALL
    assert all(got[r] == {0, 1, 4, 5} for r in range(kill + 1, 8)), got
    seconds = dict(_query(run_dir / "store.sqlite", "SELECT round_idx, seconds FROM rounds"))
    assert max(seconds.values()) < 30  # silence closed the rounds, not the 60 s deadline
    assert _skips(run_dir) == {}
    deployed = load_final(run_dir)["params"]
    assert bool(torch.isfinite(deployed).all())
    expected = _simulated(cfg, tmp_path, monkeypatch, lambda r, p: ALL - got[r]).params
    assert _max_diff(deployed, expected) <= 1e-9


@pytest.mark.slow
def test_a_client_process_dead_mid_round_is_a_dropout_at_once_and_trains_when_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process hosting clients 2 and 3 exits when handed round 2's training
    and is started again once round 2 is recorded. Gone, round 2 stops waiting
    for it within seconds (not the 30 s heartbeat timeout nor the 60 s deadline) and,
    short of min_clients = 6, is skipped; round 3 waits for the restarted process
    (deployment.live_wait_s) and has every client: the run ends where the
    simulator without clients 2 and 3 in round 2 ends."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        client_fraction=1.0,
        rounds=3,
        robust={"min_clients": 6},
        deployment={"heartbeat_timeout_s": 30, "round_deadline_s": 60, "live_wait_s": 60},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = _clients(tmp_path, port, monkeypatch, {"2-3": "1:train"})
    try:
        assert clients["2-3"].wait(60) == 1
        _wait_rounds(tmp_path, server, 2)  # round 2 closed without it (not rejoined yet)
        clients["2-3 again"] = start_client(tmp_path, port, "2-3", "--insecure")
        run_dir = _finished(server, clients, tmp_path)
    finally:
        _close(server, *clients.values())
    assert _participants(run_dir) == {0: ALL, 1: set(), 2: ALL}
    assert _skips(run_dir) == {1: "only 4 accepted update(s), fewer than min_clients = 6"}
    seconds = dict(_query(run_dir / "store.sqlite", "SELECT round_idx, seconds FROM rounds"))
    assert seconds[1] < 15, seconds  # neither the heartbeat timeout nor the deadline
    deployed = load_final(run_dir)["params"]
    gone = _simulated(cfg, tmp_path, monkeypatch, lambda r, p: {2, 3} if r == 1 else set())
    assert _max_diff(deployed, gone.params) <= 1e-9


def test_secure_aggregation_over_the_wire_ends_where_the_simulator_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SecAgg (t = ceil(0.66 * 6) = 4) with all six clients in three processes:
    the four phases travel as PHASE work, and the unmasked sums are the
    simulator's."""
    cfg = write_config(
        tmp_path / "cfg.yaml", client_fraction=1.0, rounds=3, deployment=QUIET, **SECAGG
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = _clients(tmp_path, port, monkeypatch)
    try:
        run_dir = _finished(server, clients, tmp_path)
    finally:
        _close(server, *clients.values())
    (summary,) = _query(run_dir / "store.sqlite", "SELECT summary_json FROM runs")
    assert "encode:secagg" in json.loads(summary[0])["pipeline"]
    assert _participants(run_dir) == {r: ALL for r in range(3)}
    assert _skips(run_dir) == {}
    deployed = load_final(run_dir)["params"]
    assert _max_diff(deployed, _simulated(cfg, tmp_path, monkeypatch).params) <= 1e-9


@pytest.mark.parametrize("phase", [pytest.param("masked_input", marks=pytest.mark.slow), "unmask"])
def test_secure_aggregation_recovers_the_masks_of_clients_that_died(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    """The process hosting clients 2 and 3 exits when handed round 1's ``phase``
    (FEDFORGE_TEST_EXIT_AT). 4 = t survive, so every round completes.
    masked_input: they shared their keys but sent no input; the survivors'
    shares of their secret keys remove their pairwise masks from the sum, which
    holds the four survivors. unmask: their masked inputs arrived; the survivors'
    shares of their self-mask seeds unmask them, so the sum holds all six. Round
    2 asks them again; they drop at advertise."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        client_fraction=1.0,
        rounds=3,
        deployment={"heartbeat_timeout_s": 2, **QUIET},
        **SECAGG,
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = _clients(tmp_path, port, monkeypatch, {"2-3": f"1:{phase}"})
    try:
        run_dir = _finished(server, clients, tmp_path)
    finally:
        _close(server, *clients.values())
    exits = [e for e in clients["2-3"].events() if e.get("event") == "test_exit"]
    assert [(e["round"], e["phase"]) for e in exits] == [(1, phase)]
    survivors = {0, 1, 4, 5}
    in_round_1 = ALL if phase == "unmask" else survivors
    assert _participants(run_dir) == {0: ALL, 1: in_round_1, 2: survivors}
    assert _skips(run_dir) == {}
    deployed = load_final(run_dir)["params"]
    expected = _simulated(cfg, tmp_path, monkeypatch, _dead_from({2, 3}, 1, phase)).params
    assert _max_diff(deployed, expected) <= 1e-9


@pytest.mark.slow
def test_secure_aggregation_below_threshold_skips_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """secagg_threshold 0.8: t = ceil(4.8) = 5. The process hosting clients 2 and
    3 exits when handed round 1's share_keys: 4 < t shared, so the round ends
    there, before the model goes out, with the reason in the store's anomalies.
    Never a wrong sum: the model is the one round 0 made (the simulator's run of
    one round). The next round samples the four live clients only."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        client_fraction=1.0,
        rounds=2,
        deployment={"heartbeat_timeout_s": 2, **QUIET},
        privacy={"secagg": True, "secagg_threshold": 0.8},
        communication={"clip_norm": 1.0},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = _clients(tmp_path, port, monkeypatch, {"2-3": "1:share_keys"})
    try:
        run_dir = _finished(server, clients, tmp_path)
    finally:
        _close(server, *clients.values())
    skips = _skips(run_dir)
    assert sorted(skips) == [1]
    assert "fewer than t = 5" in skips[1] and "share_keys" in skips[1], skips
    assert _participants(run_dir) == {0: ALL, 1: set()}
    deployed = load_final(run_dir)["params"]
    after_round_0 = _simulated(cfg, tmp_path, monkeypatch, rounds=1).params
    assert _max_diff(deployed, after_round_0) <= 1e-9
    expected = _simulated(cfg, tmp_path, monkeypatch, _dead_from({2, 3}, 1, "share_keys")).params
    assert _max_diff(deployed, expected) <= 1e-9


@pytest.mark.slow
def test_a_server_killed_mid_run_resumes_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL to the server once 4 of its 10 rounds are recorded (checkpoint_every
    1); the client processes keep retrying the same address, and ``fedforge
    server --resume RUN --port PORT`` finishes the run with them.

    Identical to an uninterrupted run: the final parameters (to 1e-9 in float64:
    the arrival order of the updates differs), the rounds recorded, who was in
    them and the bytes sent down (the cohorts and minibatches derive from (seed,
    round, client)). Not identical: the round recorded after the last
    checkpoint, if the kill came between the two, is run again (the store
    rewinds to the checkpoint); wall times; the bytes up, by a few (an update
    carries its train loss as JSON text, whose last digits follow the model's
    1e-16 differences); the wire bytes each server process counts (its own
    share)."""
    cfg = write_config(tmp_path / "cfg.yaml", rounds=10, checkpoint_every=1)
    port = free_port()
    server, got_port = start_server(tmp_path, cfg, "--insecure", "--port", str(port))
    assert got_port == port
    clients = {ids: start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")}
    resumed: Proc | None = None
    try:
        seen = _wait_rounds(tmp_path, server, 4)
        server.kill(signal.SIGKILL)
        assert server.popen.returncode == -signal.SIGKILL
        db = _store_file(tmp_path)
        assert db is not None
        (status,) = _query(db, "SELECT status FROM runs")[0]
        recorded = _query(db, "SELECT COUNT(*) FROM rounds")[0][0]
        assert status == "running" and seen <= recorded < 10  # killed mid-run
        resumed, _ = start_server(
            tmp_path, None, "--insecure", "--port", str(port), "--resume", str(db.parent)
        )
        run_dir = _finished(resumed, clients, tmp_path)
    finally:
        _close(server, *clients.values(), *([resumed] if resumed else []))
    assert run_dir == db.parent
    joined = [e for c in clients.values() for e in c.events() if e.get("event") == "joined"]
    assert len(joined) == 4  # each client process joined both servers
    deployed = load_final(run_dir)["params"]
    simulated = _simulated(cfg, tmp_path, monkeypatch)
    assert _max_diff(deployed, simulated.params) <= 1e-9
    assert simulated.run_dir is not None
    assert _participants(run_dir) == _participants(simulated.run_dir)
    assert len(_participants(run_dir)) == 10
    counts = "SELECT round_idx, cohort_size, bytes_down FROM rounds ORDER BY round_idx"
    assert _query(run_dir / "store.sqlite", counts) == _query(
        simulated.run_dir / "store.sqlite", counts
    )

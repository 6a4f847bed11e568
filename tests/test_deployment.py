"""A federation of real processes on loopback: a ``fedforge server`` and client
processes over gRPC end where the simulator ends, and count the bytes they send."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import torch

from deploy_procs import run_dir_of, start_client, start_server, write_config
from fedforge import config as config_mod
from fedforge import run
from fedforge.store.final import load_final


def _simulated(cfg_path: Path, tmp: Path) -> torch.Tensor:
    cfg = config_mod.override(config_mod.load(cfg_path), {"runs_dir": str(tmp / "sim")})
    return run(cfg).params


def _store_bytes(run_dir: Path) -> tuple[int, int]:
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        up, down = db.execute("SELECT SUM(bytes_up), SUM(bytes_down) FROM rounds").fetchone()
    return int(up), int(down)


def test_deployment_ends_where_the_simulator_ends(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml")
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
    assert server.wait(180) == 0, server.log.read_text()
    for c in clients:
        assert c.wait(60) == 0, c.log.read_text()
    run_dir = tmp_path / run_dir_of(server)
    deployed = load_final(run_dir)["params"]
    simulated = _simulated(cfg, tmp_path)
    assert deployed.dtype == torch.float64
    assert (deployed - simulated).abs().max().item() <= 1e-9
    # the bytes the store counts are the payload bytes that crossed the wire
    end = next(e for e in server.events() if e.get("event") == "finished")
    assert _store_bytes(run_dir) == (end["wire_bytes_up"], end["wire_bytes_down"])
    assert end["wire_bytes_up"] > 0
    joined = [e for c in clients for e in c.events() if e.get("event") == "joined"]
    assert sorted(c for e in joined for c in e["clients"]) == list(range(6))


def test_server_refuses_a_bad_config_in_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", deployment={"over_selection": -1})
    with pytest.raises(AssertionError, match="deployment.over_selection"):
        start_server(tmp_path, cfg, "--insecure")


def test_server_needs_certs_or_insecure(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml")
    with pytest.raises(AssertionError, match="needs --certs DIR"):
        start_server(tmp_path, cfg)
    assert json  # keeps the import for the log readers below

"""Operating a deployment server: its health check and Prometheus metrics while
a run is under way, and a graceful stop on SIGTERM (a checkpoint, then a resume
that ends where an uninterrupted run ends)."""

from __future__ import annotations

import signal
import sqlite3
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy_procs import run_dir_of, start_client, start_server, write_config
from deploy_sim import free_port
from fedforge import config as config_mod
from fedforge import run
from fedforge.store.final import load_final


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


def _rounds(run_dir_parent: Path) -> int:
    for db in run_dir_parent.glob("[!.]*/store.sqlite"):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])
        except sqlite3.OperationalError:
            return 0
    return 0


@pytest.mark.slow
def test_health_metrics_and_sigterm_then_resume(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", rounds=6, checkpoint_every=1)
    metrics_port, port = free_port(), free_port()
    server, _ = start_server(
        tmp_path, cfg, "--insecure", "--metrics-port", str(metrics_port), "--port", str(port)
    )
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="fedforge.v1.Federation"), timeout=10
        )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    end = time.monotonic() + 120
    while _rounds(tmp_path / "runs") < 2 and time.monotonic() < end:
        time.sleep(0.05)
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
    text = text.decode()
    assert _metric(text, "fedforge_joined_clients") == 6
    assert _metric(text, "fedforge_connected_clients") == 6
    assert _metric(text, "fedforge_answers_accepted_total") >= 6  # cold start + updates
    assert _metric(text, 'fedforge_bytes_total{direction="down"}') > 0
    assert _metric(text, "fedforge_round_seconds_count") >= 1  # a round ended
    assert 'fedforge_round_phase_info{phase="round ' in text
    server.kill(signal.SIGTERM)  # graceful: checkpoint, say how to resume
    assert server.popen.returncode == 128 + signal.SIGTERM, server.log.read_text()
    done = _rounds(tmp_path / "runs")
    assert 2 <= done < 6
    run_dir = next((tmp_path / "runs").glob("[!.]*"))
    resumed, _ = start_server(
        tmp_path, None, "--insecure", "--resume", str(run_dir), "--port", str(port)
    )
    assert resumed.wait(180) == 0, resumed.log.read_text()
    for c in clients:
        assert c.wait(90) == 0, c.log.read_text()
    sim = config_mod.override(config_mod.load(cfg), {"runs_dir": str(tmp_path / "sim")})
    final = load_final(tmp_path / run_dir_of(resumed))["params"]
    assert (final - run(sim).params).abs().max().item() <= 1e-9

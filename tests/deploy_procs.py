"""Real deployment processes on loopback for the tests: a ``fedforge server`` and
``fedforge client`` processes, their logs in files, the server's port read from
its "listening" line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FEDFORGE = [sys.executable, "-m", "fedforge.cli"]


def write_config(path: Path, **fields: Any) -> Path:
    base: dict[str, Any] = {
        "name": "dep",
        "dataset": "synthetic",
        "model": "logreg",
        "num_clients": 6,
        "client_fraction": 0.5,
        "rounds": 3,
        "local_epochs": 1,
        "batch_size": 10,
        "lr": 0.05,
        "dtype": "float64",
        "target_accuracy": None,
        "checkpoint_every": 1,
        "deployment": {"round_deadline_s": 60, "heartbeat_timeout_s": 4, "start_timeout_s": 60},
    }
    for k, v in fields.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    path.write_text(yaml.safe_dump(base))
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    out.append(json.loads(line))
        return out

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            self.popen.wait(30)


def start_server(
    tmp: Path, config: Path | None, *args: str, timeout: float = 60
) -> tuple[Proc, int]:
    log = tmp / f"server-{time.monotonic_ns()}.log"
    cmd = [*FEDFORGE, "server", "--port", "0", "--runs-dir", str(tmp / "runs"), "-q", *args]
    if config is not None:
        cmd += ["--config", str(config)]
    with log.open("wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=tmp)
    proc = Proc(p, log)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for e in proc.events():
            if e.get("event") == "listening":
                return proc, int(e["port"])
        if p.poll() is not None:
            raise AssertionError(f"server exited {p.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    raise AssertionError(f"server did not listen:\n{log.read_text()}")


def start_client(tmp: Path, port: int, ids: str, *args: str) -> Proc:
    """A client process hosting ``ids`` of the simulator's partition."""
    return _client(tmp, port, ids, "--clients", ids, *args)


def start_data_client(tmp: Path, port: int, folder: Path, client_id: int, *args: str) -> Proc:
    """A client process with its own examples in ``folder`` (``--data``)."""
    return _client(
        tmp, port, str(client_id), "--data", str(folder), "--client-id", str(client_id), *args
    )


def _client(tmp: Path, port: int, tag: str, *args: str) -> Proc:
    cmd = [
        *FEDFORGE,
        "client",
        "--server",
        f"127.0.0.1:{port}",
        "--heartbeat-s",
        "0.5",
        "--give-up-s",
        "60",
        *args,
    ]
    return start_process(tmp, f"client-{tag}", cmd)


def start_process(tmp: Path, tag: str, cmd: list[str]) -> Proc:
    """``cmd`` as a process in ``tmp``, its output in a log file named by ``tag``
    (e.g. a hostile client written for a test)."""
    log = tmp / f"{tag}-{time.monotonic_ns()}.log"
    with log.open("wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=tmp)
    return Proc(p, log)


def run_dir_of(server: Proc) -> Path:
    for e in server.events():
        if e.get("event") == "finished":
            return Path(e["run_dir"])
    raise AssertionError(f"no finished run:\n{server.log.read_text()}")

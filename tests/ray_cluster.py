"""A Ray cluster of two nodes on this machine for the tests: ``ray start --head``
and a second ``ray start --address`` (one CPU each, the second with its own
``second_node`` resource), every port of each node its own, in a temp folder of
its own. It is stopped by killing its own processes (found by that folder),
never with ``ray stop``, which ends every Ray process of the machine's user.

Ray's token authentication is off (``RAY_AUTH_MODE=disabled``, in ``env``):
``ray start --head`` turns it on by itself where ``~/.ray/auth_token`` exists,
and a process that imported Ray before the token was in its environment keeps
its first reading of the mode, so a test process could not join."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy_sim import free_port

RAY = str(Path(sys.executable).with_name("ray"))


def _node_ports() -> list[str]:
    """The ports a node binds, each a free one (two nodes on one machine would
    otherwise both take Ray's fixed defaults)."""
    return [
        f"--{name}={free_port()}"
        for name in (
            "node-manager-port",
            "object-manager-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
        )
    ]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # gone
        return []


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class LocalCluster:
    """The running cluster: its address, folder and environment."""

    address: str
    temp_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    def _own(self) -> list[int]:
        """The cluster's processes: those naming its folder and their descendants
        (workers and agents rename themselves ``ray::...``)."""
        pids = _pids()
        own = {p for p in pids if any(str(self.temp_dir) in a for a in _cmdline(p))}
        grown = True
        while grown:
            more = {p for p in pids if _parent(p) in own} - own
            own |= more
            grown = bool(more)
        own.discard(os.getpid())
        return sorted(own)

    def raylets(self) -> dict[int, str]:
        """Each node's raylet process and the node's id."""
        found = {}
        for pid in self._own():
            args = _cmdline(pid)
            if args and args[0].endswith("/raylet"):
                ids = [a.split("=", 1)[1] for a in args if a.startswith("--node_id=")]
                found[pid] = ids[0]
        return found

    def node_of(self, pid: int) -> str:
        """The id of the node whose raylet started process ``pid``."""
        return self.raylets()[_parent(pid)]

    def actors(self, class_name: str) -> list[int]:
        """The cluster's live actor processes of that class."""
        return [p for p in self._own() if _cmdline(p)[0].startswith(f"ray::{class_name}")]

    def stop(self) -> None:
        for pid in self._own():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _ray_start(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([RAY, "start", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def start_two_nodes() -> LocalCluster:
    """The head and a second node, one CPU each (see the module)."""
    # short: Ray's sockets live under it, and a socket's path has at most 107 bytes
    temp_dir = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
    }
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    cluster = LocalCluster(f"127.0.0.1:{port}", temp_dir, env)
    common = ["--num-cpus=1", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    try:
        _ray_start(
            [
                "--head",
                f"--port={port}",
                "--include-dashboard=false",
                f"--dashboard-port={free_port()}",
                f"--ray-client-server-port={free_port()}",
                *common,
                *_node_ports(),
            ],
            env,
        )
        _ray_start(
            # one GPU declared on the second node (Ray takes the count as given):
            # a worker placed there for a GPU finds none torch can use
            [f"--address={cluster.address}", '--resources={"second_node": 1}', "--num-gpus=1"]
            + common
            + _node_ports(),
            env,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def wait_until_gone(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still running after ``seconds`` (none: all ended)."""
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left

"""A dashboard in a child process, for a script, a notebook, a test or a
benchmark: ``fedforge dashboard`` on a free loopback port, its address read
from the line it prints once listening.

    with start_dashboard("runs") as dash:
        print(dash.url)  # http://127.0.0.1:PORT/
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from fedforge.core.errors import FedforgeError

_LISTENING = re.compile(r"fedforge dashboard: .* at (http://\S+/)")


class DashboardProcess:
    """A running ``fedforge dashboard``: its process, address and output file."""

    def __init__(self, popen: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.popen, self.url, self.log = popen, url, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int:
        """Interrupt it (as Ctrl-C does), kill it if it lingers; its exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)  # uvicorn shuts down cleanly
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        return int(self.popen.returncode)

    def __enter__(self) -> DashboardProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_dashboard(
    runs_dir: Path | str,
    *args: str,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> DashboardProcess:
    """Start ``fedforge dashboard --runs-dir RUNS_DIR --port 0 ARGS`` and wait until
    it listens; FedforgeError with its output if it exits or stays silent first."""
    log = log or Path(runs_dir).resolve().parent / f"dashboard-{time.monotonic_ns()}.log"
    cmd = [sys.executable, "-m", "fedforge.cli", "dashboard", "--runs-dir", str(runs_dir)]
    cmd += ["--port", "0", *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("wb") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = _LISTENING.search(log.read_text(errors="replace"))
        if found:
            return DashboardProcess(popen, found.group(1), log)
        if popen.poll() is not None:
            raise FedforgeError(
                f"the dashboard exited with status {popen.returncode}: {log.read_text().strip()}"
            )
        time.sleep(0.05)
    popen.kill()
    popen.wait()
    raise FedforgeError(f"the dashboard did not start within {timeout:g} s: {log.read_text()}")


__all__ = ["DashboardProcess", "start_dashboard"]

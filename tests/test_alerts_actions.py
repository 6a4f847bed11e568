"""An alert's actions are bounded by their timeout, with real processes and a
real HTTP server: a command that exits at once while a child it started runs
on is done at once; a command past its timeout is killed with its whole
process group; a failing command's outcome quotes the last line of a long
stderr; a URL whose server answers a byte at a time (every socket read well
within the timeout) is given up on when the timeout has passed in all."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fedforge.alerts.actions import post_url, run_command


def _gone(pid: int, within: float = 3.0) -> bool:
    """True once process ``pid`` has ended (no longer listed, or a zombie)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _background_pid(path: Path) -> int:
    deadline = time.monotonic() + 3
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, "the command never wrote its child's pid"
        time.sleep(0.02)
    return int(path.read_text())


def test_a_command_is_done_when_it_exits_not_when_its_child_does(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    argv = ("sh", "-c", f"sleep 5 & echo $! > {pidfile}; exit 0")
    start = time.monotonic()
    outcome = run_command(argv, b"{}", {}, timeout=2.0)
    took = time.monotonic() - start
    child = _background_pid(pidfile)
    try:
        assert outcome == "command: ok"
        assert took < 1.5, took  # not the 2 s timeout, not the child's 5 s
        assert not _gone(child, within=0.2)  # left running: not the command's exit
    finally:
        os.kill(child, 9)  # the test started it


def test_a_command_past_its_timeout_is_killed_with_its_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    argv = ("sh", "-c", f"sleep 8 & echo $! > {pidfile}; wait")
    start = time.monotonic()
    outcome = run_command(argv, b"{}", {}, timeout=0.5)
    took = time.monotonic() - start
    assert outcome == "command failed: no exit within 0.5 s (killed)"
    assert took < 2.5, took
    assert _gone(_background_pid(pidfile))  # the child in its group was killed too


def test_a_failing_commands_outcome_quotes_its_last_stderr_line() -> None:
    # 300 kB of stderr (past a pipe's buffer), then the line that says why
    noisy = (
        "import sys\n"
        "for i in range(3000): sys.stderr.write(f'progress {i:0>95}\\n')\n"
        "sys.stderr.write('ValueError: no pager today\\n'); sys.exit(3)"
    )
    outcome = run_command((sys.executable, "-c", noisy), b"{}", {}, timeout=20.0)
    assert outcome == "command failed: exit status 3: ValueError: no pager today"


class _Dripping(BaseHTTPRequestHandler):
    """Answers a POST one byte every 0.25 s, 4 s in all (or until told to stop)."""

    stop = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"z" * 12 + b"\r\nContent-Length: 0\r\n\r\n"
        for i in range(len(answer)):
            if self.stop.is_set() and i > 0:
                return
            self.wfile.write(answer[i : i + 1])
            self.wfile.flush()
            time.sleep(0.25 if i < 16 else 0)
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def dripping_server() -> Iterator[str]:
    _Dripping.stop.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dripping)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        _Dripping.stop.set()
        server.shutdown()
        server.server_close()


def test_a_url_is_given_up_on_when_the_timeout_has_passed_in_all(dripping_server: str) -> None:
    start = time.monotonic()
    outcome = post_url(dripping_server, b"{}", timeout=1.0)
    took = time.monotonic() - start
    assert outcome == "url failed: no answer within 1 s"
    assert 0.9 < took < 1.8, took

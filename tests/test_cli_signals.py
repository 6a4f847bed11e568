"""Signals to the ``fedforge`` command in real subprocesses: Ctrl-C while it starts
(torch still importing) is one line and exit status 130, like one after start-up;
two SIGTERMs stop a run at once and leave it ``stopped`` and resumable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _wait_for_torch_loading(proc: subprocess.Popen[str]) -> None:
    """Until torch's shared library is mapped into ``proc``: it is importing torch."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
        except OSError:
            maps = ""
        if "libtorch" in maps:
            return
        time.sleep(0.002)
    raise AssertionError("the command did not start importing torch in 30 s")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
@pytest.mark.parametrize("how", ["module", "script"])
def test_ctrl_c_while_starting_is_one_line_and_130(tmp_path: Path, how: str) -> None:
    if how == "module":
        command = [sys.executable, "-m", "fedforge.cli"]
    else:
        script = Path(sys.executable).parent / "fedforge"
        if not script.is_file():
            pytest.skip("no fedforge console script beside the interpreter")
        command = [sys.executable, str(script)]
    proc = subprocess.Popen(
        [*command, "runs", "--runs-dir", str(tmp_path)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_torch_loading(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "fedforge: interrupted", err
    assert out == ""


def test_importing_fedforge_from_a_program_keeps_its_keyboard_interrupt() -> None:
    from fedforge import _started_as_the_command

    python = sys.executable
    assert _started_as_the_command([python, "-m", "fedforge.cli", "run"])
    assert _started_as_the_command([python, "-X", "dev", "/venv/bin/fedforge", "runs"])
    assert not _started_as_the_command([python, "-m", "pytest", "tests"])
    assert not _started_as_the_command([python, "-c", "import fedforge"])
    assert not _started_as_the_command([python, "train.py"])
    assert not _started_as_the_command([python])

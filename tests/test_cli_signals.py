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

from fedforge.store import RunStore

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _default_sigint() -> None:
    """A terminal's Ctrl-C reaches the command with SIGINT's default action; a test
    run started in the background (``make test &``) would pass on SIG_IGN, which
    Python keeps, and the command would never see the interrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
        preexec_fn=_default_sigint,
    )
    _wait_for_torch_loading(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "fedforge: interrupted", err
    assert out == ""


@pytest.mark.slow
def test_a_second_sigterm_stops_at_once_and_the_run_is_stopped_and_resumable(
    mnist_dir: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    config = tmp_path / "slow.yaml"
    config.write_text(  # three clients of 100 examples, 50 epochs each: ~1 s a round
        "name: slow\nmodel: 2nn\nnum_clients: 600\nclient_fraction: 0.005\nbatch_size: 10\n"
        f"local_epochs: 50\nrounds: 4\ncheckpoint_every: 1\ntarget_accuracy: null\n"
        f"data_dir: {mnist_dir}\nruns_dir: {runs}\n"
    )
    cli = [sys.executable, "-m", "fedforge.cli"]
    proc = subprocess.Popen(
        [*cli, "run", "-c", str(config), "-q"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any(len(p.read_text().splitlines()) >= 1 for p in runs.glob("*/metrics.jsonl")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no round recorded in 120 s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    for line in proc.stderr:  # the handler says it finishes the round: send the second
        if "finishing this round" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped at once by a second SIGTERM" in err and "Traceback" not in err
    (run_dir,) = runs.iterdir()
    with RunStore.open(run_dir) as store:
        info = store.info()
        assert info.status == "stopped", store.summary()
        assert info.rounds_done < 4
    listed = subprocess.run(
        [*cli, "runs", "--runs-dir", str(runs)], env=ENV, capture_output=True, text=True
    )
    assert "stopped" in listed.stdout and "failed" not in listed.stdout, listed.stdout
    done = subprocess.run(
        [*cli, "resume", run_dir.name, "--runs-dir", str(runs), "-q"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with RunStore.open(run_dir) as store:
        assert store.status == "finished" and len(store.rounds()) == 4

"""engine: auto's probe: a process that probed exits, and a probe timed on a
busy machine, or that cannot write its cache, says so and is not cached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.conftest import MakeData
from tests.test_threads_probe import SIZES, _cfg

from fedforge.engines import close_engine
from fedforge.server import engine_choice, probe
from fedforge.server.experiment import Experiment, build

pytestmark = pytest.mark.all_cores  # workers and probes read the usable cores

ROOT = Path(__file__).resolve().parents[1]


def _probe_processes(runs: int, repeats: int, drain: str | None) -> None:
    """``runs`` processes, each timing a pool ``repeats`` times, every one exits
    in time, without a traceback."""
    args = [sys.executable, "-m", "tests.probe_exit_child", str(repeats), "8"]
    if drain is not None:
        args.append(drain)
    for _ in range(runs):
        try:
            done = subprocess.run(
                args, cwd=ROOT, capture_output=True, text=True, timeout=40, env=os.environ.copy()
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"the process did not exit in 40 s; its output: {exc.stdout!r}")
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert done.stdout.splitlines()[-1] == "done"
        assert "Traceback" not in done.stderr, (done.stdout, done.stderr)
        # each timing and its pool's close take well under the manager thread's 10 s wait
        seconds = [float(line.split()[2]) for line in done.stdout.splitlines()[:-1]]
        assert len(seconds) == repeats and max(seconds) < 8, seconds


@pytest.mark.parametrize("drain", [None, "0"], ids=["jobs-finish", "killed-mid-send"])
def test_a_process_that_probed_exits(drain: str | None) -> None:
    """The probe stops timing while both workers send multi-MiB results; the
    pool's close lets them finish (or, killing them, first closes this
    process's write end of the result pipe), so the process exits."""
    _probe_processes(1, 6, drain)


@pytest.mark.slow
@pytest.mark.parametrize("drain", [None, "0"], ids=["jobs-finish", "killed-mid-send"])
def test_a_process_that_probed_always_exits(drain: str | None) -> None:
    _probe_processes(5, 20, drain)


# --- timings that disagree, a cache that cannot be written ----------------------


def _build(make_data: MakeData) -> Experiment:
    """A 2NN run with engine: auto over two cores: four candidates, the rules'
    pick (the incumbent) the vectorised engine in this process."""
    exp = build(_cfg(workers=0), make_data(SIZES, dtype=torch.float32))
    close_engine(exp.engine)
    return exp


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, list[float]]:
    """The probe on with its cache in a temp folder, each candidate's timings
    taken in turn from the lists the test fills (empty: 100 samples/s)."""
    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 2)
    monkeypatch.setenv(probe.PROBE_ENV, "24")
    monkeypatch.setenv("FEDFORGE_CACHE", str(tmp_path / "cache"))
    rates: dict[str, list[float]] = {}
    monkeypatch.setattr(probe, "_rate", lambda c, *a: (rates.get(c.name) or [100.0]).pop(0))
    return rates


def test_steady_timings_are_cached(timed: dict[str, list[float]], make_data: MakeData) -> None:
    timed["serialx2"] = [300.0, 290.0, 310.0]  # within 25% of the best: steady
    first = _build(make_data)
    assert first.engine.name == "serialx2"
    assert "looked busy" not in first.probe_line and "(probe, " in first.probe_line
    assert "serialx2 310" in first.probe_line  # the best of its three timings
    second = _build(make_data)
    assert "cached probe" in second.probe_line and second.engine.name == "serialx2"


@pytest.mark.parametrize(
    ("serialx2", "why"),
    [
        # 136-367: 231 apart, more than 25% of 367 (92)
        ([136.0, 367.0, 200.0], "serialx2 timed 136-367 samples/s"),
        # each within 25%, but the first repeat alone keeps the incumbent (110 < 1.25 x 100)
        ([110.0, 130.0, 130.0], "its repeats picked vectorized and serialx2"),
    ],
)
def test_timings_that_disagree_are_not_cached(
    serialx2: list[float], why: str, timed: dict[str, list[float]], make_data: MakeData
) -> None:
    timed["serialx2"] = list(serialx2)
    first = _build(make_data)
    assert first.engine.name == "serialx2"  # this run takes the best figures' pick
    assert f"the machine looked busy ({why}, load average " in first.probe_line
    assert "not cached, probed again next run" in first.probe_line
    assert not (Path(os.environ["FEDFORGE_CACHE"]) / probe.CACHE_NAME).exists()
    second = _build(make_data)  # probed again: steady now, another pick
    assert "cached" not in second.probe_line and second.engine.name == "vectorized"


def test_a_cache_that_cannot_be_written_is_said(
    timed: dict[str, list[float]], make_data: MakeData
) -> None:
    cache = Path(os.environ["FEDFORGE_CACHE"])
    cache.mkdir()
    (cache / probe.CACHE_NAME).mkdir()  # in the way of the file, as root can meet it too
    line = _build(make_data).probe_line
    assert f"the probe's cache {cache / probe.CACHE_NAME} cannot be written (" in line
    assert line.endswith("): every run probes again")

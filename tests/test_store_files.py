"""A run store's files as the file system may hand them over: a FIFO, a link to
/dev/zero or a 16 GiB sparse file in place of the lock, the WAL or the stream, and
final parameters flipped, cut short or deleted. Real ``fedforge`` commands over
real small runs: each damaged run is reported as damaged, in time, in one line,
and never hides or hangs the others."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from tests.conftest import TINY_LOGREG

from fedforge.config import from_dict
from fedforge.server.loop import run
from fedforge.store.final import FINAL_META, FINAL_NAME

TIMEOUT = 60  # a command that blocks on a FIFO never ends: the test fails instead
SPARSE = 16 << 30


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def _sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(SPARSE)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-9])


def _both(path: Path) -> None:
    path.unlink()
    (path.parent / FINAL_NAME).unlink()


# (file of the run, what is done to it, words the damage is reported in)
DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "fifo-lock": ("lock", _fifo, "its lock is a FIFO, not a regular file"),
    "fifo-wal": ("store.sqlite-wal", _fifo, "its store.sqlite-wal is a FIFO"),
    "fifo-metrics": ("metrics.jsonl", _fifo, "its metrics.jsonl is a FIFO"),
    "zero-wal": ("store.sqlite-wal", _zero, "its store.sqlite-wal is a character device"),
    "zero-metrics": ("metrics.jsonl", _zero, "its metrics.jsonl is a character device"),
    "sparse-wal": ("store.sqlite-wal", _sparse, f"holds {SPARSE:,} bytes, more than"),
    "sparse-metrics": ("metrics.jsonl", _sparse, f"holds {SPARSE:,} bytes, more than"),
    "flipped-final": (FINAL_NAME, _flip, f"{FINAL_NAME} fails its sha256 check"),
    "cut-final": (FINAL_NAME, _cut, f"{FINAL_NAME} has "),
    "deleted-final": (FINAL_NAME, lambda p: p.unlink(), f"{FINAL_NAME} is missing"),
    "deleted-final-json": (FINAL_META, lambda p: p.unlink(), f"its {FINAL_META} is missing"),
    "deleted-final-both": (FINAL_META, _both, "its final parameters (final_params.safetensors, "),
}
QUICK = ["fifo-lock"]  # the rest: slow (every kind is listed by `runs`)


def fedforge(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "fedforge.cli", *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"fedforge {' '.join(args)} did not end in {TIMEOUT} s")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished two-round run (its folder)."""
    from tests.conftest import _make_data

    runs = tmp_path_factory.mktemp("runs")
    cfg = from_dict({**TINY_LOGREG, "rounds": 2, "runs_dir": str(runs), "name": "good"})
    result = run(cfg, data=_make_data([5, 6, 7, 8]))
    assert result.run_dir is not None
    return result.run_dir


def _copy(finished: Path, runs: Path, kind: str) -> Path:
    """A copy of the finished run, named ``kind``, with that damage done to it."""
    path = runs / f"{finished.name[:15]}-{kind}-{finished.name[-6:]}"
    shutil.copytree(finished, path)
    name, damage, _ = DAMAGE[kind]
    target = path / name
    if not target.exists() and name == "store.sqlite-wal":
        target.touch()
    damage(target)
    return path


def _runs_with(finished: Path, tmp_path: Path, kinds: list[str]) -> tuple[Path, dict[str, Path]]:
    """A runs folder holding the good run and a damaged copy of each kind."""
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copytree(finished, runs / finished.name)
    return runs, {kind: _copy(finished, runs, kind) for kind in kinds}


def test_runs_lists_every_damaged_run_and_the_good_one(finished: Path, tmp_path: Path) -> None:
    runs, damaged = _runs_with(finished, tmp_path, sorted(DAMAGE))
    done = fedforge("runs", "--runs-dir", str(runs))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "Traceback" not in done.stderr
    good = [line for line in lines if finished.name in line]
    assert len(good) == 1 and "finished" in good[0]
    for path in damaged.values():
        (line,) = [line for line in lines if line.startswith(path.name + " ")]
        assert "damaged" in line and "finished" not in line, line


def _kinds(quick: list[str]) -> list[object]:
    return [k if k in quick else pytest.param(k, marks=pytest.mark.slow) for k in sorted(DAMAGE)]


@pytest.mark.parametrize("kind", _kinds(QUICK))
def test_show_and_resume_say_a_run_is_damaged(finished: Path, tmp_path: Path, kind: str) -> None:
    runs, made = _runs_with(finished, tmp_path, [kind])
    damaged = made[kind]
    words = DAMAGE[kind][2]
    show = fedforge("show", damaged.name, "--runs-dir", str(runs))
    assert show.returncode != 0 and "Traceback" not in show.stderr, show.stderr
    (line,) = show.stderr.strip().splitlines()
    assert "is damaged" in line and words in line, line
    if "final" in kind:  # a finished run's parameters: its report says so too
        report = fedforge(
            "report", damaged.name, "--runs-dir", str(runs), "-o", str(tmp_path / "r.html")
        )
        assert report.returncode != 0 and "Traceback" not in report.stderr, report.stderr
        assert words in report.stderr and not (tmp_path / "r.html").exists()
        return
    resume = fedforge("resume", str(damaged))
    assert resume.returncode != 0 and "Traceback" not in resume.stderr, resume.stderr
    (line,) = resume.stderr.strip().splitlines()
    assert "is damaged" in line and words in line, line


def test_a_sweep_runs_a_point_whose_final_parameters_are_damaged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flipped bit in a finished point's final parameters: the next sweep says
    so in a line and runs the point again, rather than reusing it in silence."""
    from fedforge.cli import main
    from fedforge.store import list_runs

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY_LOGREG, "dataset": "synthetic", "name": "tiny"}))
    argv = ["sweep", str(path), "--grid", "lr=0.05", "-q", "--runs-dir", "s"]
    assert main(argv) == 0
    (first,) = list_runs(tmp_path / "s")
    _flip(first.path / FINAL_NAME)
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"sweep: run {first.run_id} of point tiny-lr=0.05 is damaged" in err
    statuses = sorted(r.status for r in list_runs(tmp_path / "s"))
    assert statuses == ["damaged", "finished"]

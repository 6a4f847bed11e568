"""The install as a user meets it: the slim install (the core, what a simulation
needs) against the full one (``.[dev]``: every extra and the dev tools), each
into a fresh virtual environment, side by side; and how long ``fedforge --help``
takes from the slim install's console script.

    python benchmarks/practice_install.py              # both installs, 7 --help runs
    python benchmarks/practice_install.py --repeat 11

Each install is what ``make run`` and ``make venv`` do: ``python -m venv``, pip
upgraded, ``pip install torch==2.13.0`` (the pinned CPU wheel first), then the
package (``pip install .`` / ``pip install .[dev]``, from a copy of this
checkout's pyproject.toml, README.md and src/). pip reads
whatever index this machine is configured with (here: wheels on local disk, so
the seconds are install work, not downloads). Sizes: the bytes under the venv.

Figures: help_s (median seconds of ``fedforge --help``), torch_import_s (median
seconds of ``python -c 'import torch'`` in the same venv: what every start paid
before the arguments were read lazily), install_mib / install_s (slim),
install_full_mib / install_full_s (``.[dev]``).

The JSON goes to benchmarks/results/practice_install/. Last line:
``RESULT help_s=... install_mib=... install_s=... install_full_mib=... install_full_s=...``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, machine, result_line

sys.path.insert(0, str(ROOT / ".ci"))
from test_wheel import package_sources  # noqa: E402

TORCH = "torch==2.13.0"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _mib(folder: Path) -> float:
    total = sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    return total / 2**20


def install(venv: Path, target: str) -> tuple[float, float]:
    """A fresh venv with torch, then ``target``: (seconds, MiB)."""
    shutil.rmtree(venv, ignore_errors=True)
    start = time.perf_counter()
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", TORCH],
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", target],
    ]
    for cmd in steps:
        subprocess.run(cmd, check=True, env=_env(), cwd=venv.parent, capture_output=True)
    return time.perf_counter() - start, _mib(venv)


def median_seconds(cmd: list[str], repeat: int, cwd: Path) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=_env(), cwd=cwd, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(repeat: int = 7) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fedforge-install-") as tmp:
        work = Path(tmp)
        source = package_sources(work / "source")
        slim = work / "slim"
        install_s, install_mib = install(slim, str(source))
        help_s = median_seconds([str(slim / "bin/fedforge"), "--help"], repeat, work)
        torch_s = median_seconds([str(slim / "bin/python"), "-c", "import torch"], repeat, work)
        shutil.rmtree(slim)  # one venv on disk at a time
        full_s, full_mib = install(work / "full", f"{source}[dev]")
    return {
        "help_s": help_s,
        "torch_import_s": torch_s,
        "install_mib": install_mib,
        "install_s": install_s,
        "install_full_mib": full_mib,
        "install_full_s": full_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs of --help (median)")
    args = parser.parse_args()
    figures = measure(args.repeat)
    out = ROOT / "benchmarks/results/practice_install"
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    record = {"figures": figures, "repeat": args.repeat, "machine": machine()}
    (out / f"{stamp}.json").write_text(json.dumps(record, indent=2) + "\n")
    for k, v in figures.items():
        print(f"{k:18} {v:10.2f}")
    print(result_line(figures))


if __name__ == "__main__":
    main()

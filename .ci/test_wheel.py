"""CI: fedforge as a user installs it, not as the checkout runs it.

Builds the wheel (its build must not warn that a setting is deprecated),
installs it into a fresh virtual environment (torch first, pinned, as the
Makefile does) and, from a folder outside the checkout, runs the installed
``fedforge``: the slim install runs a simulation and names the extra a
deployment needs; with ``[deploy,report]`` added, a mutual-TLS federation of a
server and two clients on loopback (certificates from ``fedforge certs``), the
HTML report of its run and the dashboard serving its static files. A file
missing from the wheel (generated gRPC code, the dashboard's static files)
fails one of these steps.

Usage: python .ci/test_wheel.py [--keep DIR]   (stdlib only; ~2 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # as the Makefile: the CPU wheel on the project's machines
CONFIG = """\
name: wheel
dataset: synthetic
model: logreg
num_clients: 2
client_fraction: 1.0
rounds: 2
batch_size: 10
target_accuracy: null
checkpoint_every: 1
deployment: {round_deadline_s: 60, heartbeat_timeout_s: 10, start_timeout_s: 120}
"""


def step(what: str) -> None:
    print(f"test-wheel: {what}", flush=True)


def sh(*cmd: str | Path, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    """Run ``cmd``; its output, or exit with it shown when it fails."""
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        sys.exit(
            f"test-wheel: {' '.join(map(str, cmd))} exited {proc.returncode}:\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout + proc.stderr


def package_sources(dest: Path) -> Path:
    """A copy of what the package is built from (as the Dockerfile copies it): pip
    builds a folder in place, and a build/ left in the checkout would carry files
    since deleted from src/ into the wheel."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", dest / "src", ignore=ignore)
    return dest


def build_wheel(dist: Path, env: dict[str, str]) -> Path:
    source = package_sources(dist.parent / "source")
    log = sh(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-v",
        "--no-deps",
        "-w",
        dist,
        source,
        cwd=source,
        env=env,
    )
    deprecated = [line for line in log.splitlines() if "DeprecationWarning" in line]
    if deprecated:
        sys.exit("test-wheel: the build warns:\n" + "\n".join(deprecated))
    [wheel] = dist.glob("fedforge-*.whl")
    return wheel


def events(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def wait_for(log: Path, proc: subprocess.Popen, event: str, timeout: float) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = [e for e in events(log) if e.get("event") == event]
        if found:
            return found[0]
        if proc.poll() is not None and not [e for e in events(log) if e.get("event") == event]:
            sys.exit(f"test-wheel: exited {proc.returncode} before '{event}':\n{log.read_text()}")
        time.sleep(0.2)
    sys.exit(f"test-wheel: no '{event}' in {timeout:.0f} s:\n{log.read_text()}")


def federation(fedforge: Path, work: Path, env: dict[str, str]) -> Path:
    """A server and two client processes over mutual TLS; the run's folder."""
    sh(fedforge, "certs", "--out", "fed", "--clients", "0-1", cwd=work, env=env)
    (work / "fed.yaml").write_text(CONFIG)
    procs: list[subprocess.Popen] = []
    logs = {name: work / f"{name}.log" for name in ("server", "client-0", "client-1")}
    try:
        with logs["server"].open("wb") as f:
            cmd = [
                fedforge,
                "server",
                "--config",
                "fed.yaml",
                "--certs",
                "fed",
                "--port",
                "0",
                "--runs-dir",
                "runs",
                "-q",
            ]
            procs.append(subprocess.Popen(cmd, cwd=work, env=env, stdout=f, stderr=f))
        port = wait_for(logs["server"], procs[0], "listening", 120)["port"]
        for k in (0, 1):
            with logs[f"client-{k}"].open("wb") as f:
                cmd = [
                    fedforge,
                    "client",
                    "--server",
                    f"localhost:{port}",
                    "--certs",
                    "fed",
                    "--name",
                    f"client-{k}",
                    "--clients",
                    str(k),
                ]
                procs.append(subprocess.Popen(cmd, cwd=work, env=env, stdout=f, stderr=f))
        finished = wait_for(logs["server"], procs[0], "finished", 300)
        for proc, log in zip(procs, logs.values(), strict=True):
            if proc.wait(120) != 0:
                sys.exit(f"test-wheel: {log.stem} exited {proc.returncode}:\n{log.read_text()}")
        return Path(finished["run_dir"])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def dashboard(fedforge: Path, work: Path, env: dict[str, str]) -> None:
    """The dashboard answers its page and serves every static file the checkout has."""
    log = work / "dashboard.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [fedforge, "dashboard", "--runs-dir", "runs", "--port", "0"],
            cwd=work,
            env=env,
            stdout=f,
            stderr=f,
        )
    try:
        end = time.monotonic() + 60
        while not (url := re.search(r"http://127\.0\.0\.1:\d+/", log.read_text())):
            if proc.poll() is not None or time.monotonic() > end:
                sys.exit(f"test-wheel: the dashboard did not start:\n{log.read_text()}")
            time.sleep(0.2)
        static = ROOT / "src/fedforge/report/dashboard/static"
        for path in ["", "static/plotly.min.js", *(f"static/{p.name}" for p in static.iterdir())]:
            with urllib.request.urlopen(url[0] + path, timeout=30) as answer:
                if answer.status != 200 or not answer.read():
                    sys.exit(f"test-wheel: the dashboard answered {answer.status} for /{path}")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="work in DIR and keep it (default: a temp dir)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="fedforge-wheel-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    started = time.monotonic()
    try:
        step("building the wheel")
        wheel = build_wheel(work / "dist", env)
        step(f"a fresh venv: {TORCH}, then {wheel.name} alone (the slim install)")
        sh(sys.executable, "-m", "venv", work / "venv", cwd=work, env=env)
        pip = [work / "venv/bin/python", "-m", "pip", "install", "-q"]
        sh(*pip, TORCH, cwd=work, env=env)
        sh(*pip, wheel, cwd=work, env=env)
        fedforge = work / "venv/bin/fedforge"
        where = sh(
            work / "venv/bin/python",
            "-c",
            "import fedforge; print(fedforge.__file__)",
            cwd=work,
            env=env,
        )
        if not where.strip().startswith(str(work / "venv")):
            sys.exit(f"test-wheel: fedforge imported from {where.strip()}, not the venv")
        version = sh(fedforge, "--version", cwd=work, env=env).strip()
        step(f"{version}: a simulation")
        out = sh(
            fedforge,
            "run",
            "-q",
            "--runs-dir",
            "sim",
            "-s",
            "dataset=synthetic",
            "-s",
            "model=logreg",
            "-s",
            "num_clients=4",
            "-s",
            "rounds=2",
            "-s",
            "target_accuracy=null",
            cwd=work,
            env=env,
        )
        if not re.search(r"rounds done\s+2\b", out):
            sys.exit(f"test-wheel: the simulation did not do 2 rounds:\n{out}")
        proc = subprocess.run(
            [fedforge, "server", "--insecure"], cwd=work, env=env, capture_output=True, text=True
        )
        if proc.returncode != 2 or "pip install 'fedforge[deploy]'" not in proc.stderr:
            sys.exit(f"test-wheel: without [deploy], server said:\n{proc.stderr}")
        step("adding [deploy,report]: a mutual-TLS federation, a report, the dashboard")
        sh(*pip, f"{wheel}[deploy,report]", cwd=work, env=env)
        run_dir = federation(fedforge, work, env)
        sh(fedforge, "report", run_dir, "-o", "report.html", cwd=work, env=env)
        if "Plotly" not in (work / "report.html").read_text():
            sys.exit("test-wheel: the report has no plotly.js")
        dashboard(fedforge, work, env)
        step(f"passed in {time.monotonic() - started:.0f} s")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

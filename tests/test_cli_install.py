"""The ``fedforge`` command as a slim install meets it, in real subprocesses:
``--help``, ``--version`` and argument errors answer without loading torch; a
simulation, its run table and the Python API need none of the optional extras;
a command whose extra is missing names the ``pip install`` that adds it, in one
line and with exit status 2, never a traceback."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from fedforge.core.extras import extra_of

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

# Every optional dependency of pyproject.toml, by the module it installs.
OPTIONAL = (
    "grpc",
    "grpc_health",
    "google.protobuf",
    "prometheus_client",
    "plotly",
    "starlette",
    "uvicorn",
    "tensorboard",
    "mlflow",
    "pyarrow",
)
HEAVY = ("torch", "numpy", "yaml", "safetensors", "cryptography", *OPTIONAL)

# Runs the command's main() (or, with '-', the rest as Python) with the modules
# named in argv[1] made not installed: their import fails as a missing module does.
WITHOUT = textwrap.dedent(
    """
    import sys
    from importlib.abc import MetaPathFinder

    blocked = [m for m in sys.argv[1].split(",") if m]

    class NotInstalled(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == m or name.startswith(m + ".") for m in blocked):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    if sys.argv[2] == "-":
        exec(sys.argv[3])
    else:
        from fedforge.cli import main

        status = main(sys.argv[2:])
        print("torch loaded:", "torch" in sys.modules)
        sys.exit(status)
    """
)


def _without(modules: tuple[str, ...], *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, ",".join(modules), *argv],
        env=ENV,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _imported(stderr: str) -> set[str]:
    """The modules a ``python -X importtime`` run imported (its lines on stderr)."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def _project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["--help"], 0),
        (["--version"], 0),
        (["server", "--help"], 0),
        (["run", "--no-such-option"], 2),
        (["server", "--port", "eighty"], 2),
        (["no-such-command"], 2),
    ],
)
def test_help_version_and_argument_errors_load_no_torch(
    tmp_path: Path, argv: list[str], status: int
) -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fedforge.cli", *argv],
        env=ENV,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == status, proc.stderr[-2000:]
    loaded = _imported(proc.stderr)
    assert "fedforge.cli" in loaded or "argparse" in loaded  # importtime did report
    heavy = sorted(m for m in loaded if m.split(".")[0] in {h.split(".")[0] for h in HEAVY})
    assert heavy == [], heavy
    if argv == ["--version"]:
        assert proc.stdout.strip() == f"fedforge {_project_version()}"
    if status == 2:
        assert "Traceback" not in proc.stderr
        assert "error:" in proc.stderr


def test_a_simulation_and_the_api_need_no_extra(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    tiny = [
        "-s", "dataset=synthetic", "-s", "model=logreg", "-s", "num_clients=4",
        "-s", "client_fraction=1.0", "-s", "rounds=2", "-s", "target_accuracy=null",
        "-s", "checkpoint_every=0", "-s", "name=slim",
    ]  # fmt: skip
    proc = _without(OPTIONAL, "run", *tiny, "--runs-dir", str(runs), "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"rounds done\s+2\b", proc.stdout), proc.stdout
    [run_dir] = list(runs.iterdir())
    for command in (
        ["runs", "--runs-dir", str(runs)],
        ["show", run_dir.name, "--runs-dir", str(runs)],
    ):
        shown = _without(OPTIONAL, *command, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert run_dir.name in shown.stdout
    api = (
        "import fedforge\n"
        "cfg = fedforge.Config(dataset='synthetic', model='logreg', num_clients=4,"
        " client_fraction=1.0, rounds=1, target_accuracy=None, checkpoint_every=0,"
        f" name='api', runs_dir={str(runs)!r})\n"
        "result = fedforge.run(cfg, progress=False)\n"
        "print('rounds', result.summary['rounds_done'])\n"
    )
    ran = _without(OPTIONAL, "-", api, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "rounds 1" in ran.stdout


def test_every_package_of_an_extra_is_named_by_its_modules() -> None:
    """Each package an extra of pyproject.toml installs provides a module that
    ``core/extras.py`` maps to that extra (read from the installed packages'
    own metadata), so a missing one is named, whichever it is."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        optional = tomllib.load(f)["project"]["optional-dependencies"]
    providers = importlib.metadata.packages_distributions()
    for extra in ("deploy", "report", "tensorboard", "mlflow", "parquet"):
        for requirement in optional[extra]:
            package = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()
            modules = [
                m
                for m, dists in providers.items()
                if package in {d.lower().replace("_", "-") for d in dists}
            ]
            assert modules, f"{package} is not installed here"
            assert extra in {extra_of(m) for m in modules}, (package, modules)


def test_the_public_names_load_on_first_use_without_torch_before() -> None:
    """``import fedforge`` alone loads no torch; each name of ``__all__`` loads on
    first use, as the module that defines it has it."""
    code = (
        "import importlib, sys, fedforge\n"
        "assert 'torch' not in sys.modules\n"
        "for name in fedforge.__all__:\n"
        "    home = importlib.import_module(fedforge._PUBLIC[name])\n"
        "    assert getattr(fedforge, name) is getattr(home, name), name\n"
        "assert sorted(fedforge._PUBLIC) == sorted(fedforge.__all__)\n"
        "print('torch' in sys.modules, fedforge.__version__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", _project_version()]


@pytest.mark.parametrize(
    ("missing", "argv", "extra"),
    [
        ("grpc", ["server", "--insecure", "--port", "0"], "deploy"),
        ("grpc_health", ["server", "--insecure", "--port", "0"], "deploy"),
        ("prometheus_client", ["server", "--insecure", "--port", "0"], "deploy"),
        ("grpc", ["client", "--server", "127.0.0.1:1", "--clients", "0", "--insecure"], "deploy"),
        ("google.protobuf", ["client", "--server", "127.0.0.1:1", "--clients", "0"], "deploy"),
        ("plotly", ["report", "any-run"], "report"),
        ("plotly", ["compare", "any-run"], "report"),
        ("starlette", ["dashboard", "--runs-dir", "."], "report"),
        ("uvicorn", ["dashboard", "--runs-dir", "."], "report"),
    ],
)
def test_a_command_without_its_extra_names_the_pip_install(
    tmp_path: Path, missing: str, argv: list[str], extra: str
) -> None:
    proc = _without((missing,), *argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"pip install 'fedforge[{extra}]'" in lines[0]
    assert f"'fedforge {argv[0]}'" in lines[0] and missing in lines[0]
    assert proc.stdout.splitlines()[-1] == "torch loaded: False"  # said before torch loads
    assert not (tmp_path / "runs").exists()  # refused before any run was made


def test_an_extra_missing_where_it_is_imported_names_the_pip_install(tmp_path: Path) -> None:
    """Past the up-front check (emptied here), the import that fails is caught at
    the command's boundary with the same line."""
    code = (
        "import sys, fedforge.cli as cli\n"
        "cli.NEEDS.clear()\n"
        "sys.exit(cli.main(['server', '--insecure', '--port', '0', '-s', 'dataset=synthetic',"
        " '-s', 'model=logreg', '--runs-dir', 'runs']))\n"
    )
    proc = _without(("grpc",), "-", code, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "fedforge: error: 'fedforge server' needs the 'deploy' extra (no module 'grpc'): "
        "pip install 'fedforge[deploy]'"
    ]

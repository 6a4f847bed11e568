"""The ``fedforge`` command: a user's mistake ends in one line naming the bad value and
exit status 2 (never a traceback, never a half-made run directory); a real run end to
end in a subprocess writes a run that ``runs`` and ``show`` can read."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import fedforge.data.mnist
import fedforge.server.experiment
from fedforge.cli import main
from fedforge.config import Config, load
from fedforge.core.errors import DataError
from fedforge.data.federated import FederatedData
from fedforge.engines import SimulationEngine
from fedforge.store import RunStore, list_runs

MakeData = Callable[..., FederatedData]

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = """\
name: tiny
model: 2nn
num_clients: 4
partition: {kind: iid}
rounds: 2
client_fraction: 0.5
"""


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fedforge: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    "override, words",
    [
        ("lr=-0.1", ["'lr'", "-0.1"]),
        ("client_fraction=1.5", ["'client_fraction'", "1.5", "(0, 1]"]),
        ("algorithm=fedfoo", ["'algorithm'", "'fedfoo'", "'fedavg'"]),
        ("partition.alpha=0", ["'partition.alpha'"]),
        ("local_epoch=5", ["'local_epoch'", "did you mean 'local_epochs'"]),
        ("local_epochs", ["local_epochs", "field=value"]),
        ("lr=.inf", ["'lr'", "inf", "finite"]),  # YAML's infinity
        ("server_optimizer.lr=1e400", ["'server_optimizer.lr'", "finite"]),
        ("batch_size=foo", ["'batch_size'", "'foo'", "integer, or null"]),
        ("privacy.tiers.high_clients=1,x", ["'privacy.tiers.high_clients'", "'x'"]),
    ],
)
def test_bad_value_exits_2_with_one_line(
    tiny_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    override: str,
    words: list[str],
) -> None:
    runs = tmp_path / "runs"
    argv = ["run", "-c", str(tiny_config), "--set", override, "--runs-dir", str(runs), "-q"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    line = one_error_line(err)
    for word in words:
        assert word in line
    assert out == ""  # refused before anything started
    assert not runs.exists()


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\xff\xfe\x00bad", ["not UTF-8 text", "byte 0"]),
        (b"lr: [0.1\n", ["not valid YAML", "line 2, column 1"]),
        (
            b"lr: 0.1\nrounds: 3\nlr: 0.5\n",
            ["not valid YAML", "'lr' given twice at line 3, column 1"],
        ),
        (b"x: !!python/object:os.system ls\n", ["not valid YAML", "python/object"]),
    ],
)
def test_a_bad_config_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: list[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    for command in (["run", "-c", str(path)], ["sweep", str(path), "--grid", "lr=0.1,0.2"]):
        assert main([*command, "--runs-dir", str(tmp_path / "runs"), "-q"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert all(w in line for w in words), line
    assert not (tmp_path / "runs").exists()


def test_comma_lists_and_numeric_names_from_the_command_line(tiny_config: Path) -> None:
    from fedforge.cli import _parser, _resolve_config

    args = _parser().parse_args(
        [
            "run",
            "-c",
            str(tiny_config),
            "--set",
            "privacy.tiers.high_clients=1,2",
            "--set",
            "privacy.secagg=true",
            "--set",
            "name=2024",
            "--set",
            "partition.feature_shift=rotation,invert",
        ]
    )
    cfg = _resolve_config(args)
    assert cfg.privacy.tiers.high_clients == (1, 2)
    assert cfg.name == "2024"
    assert cfg.partition.feature_shift == ("rotation", "invert")


def test_a_bad_grid_value_is_one_line(
    tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    argv = ["sweep", str(tiny_config), "--grid", "lr=[0.1", "--runs-dir", str(runs), "-q"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "'lr'" in line and "[0.1" in line
    assert not runs.exists()


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["run", "-c", str(missing), "-q"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(missing) in line and "does not exist" in line


def test_missing_data_exits_2_offline(
    tiny_config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    empty_data, empty_cache, runs = tmp_path / "data", tmp_path / "cache", tmp_path / "runs"
    empty_data.mkdir()
    empty_cache.mkdir()
    monkeypatch.setenv("FEDFORGE_CACHE", str(empty_cache))
    monkeypatch.setenv("FEDFORGE_DATA", str(empty_data))

    def offline(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("offline (test)")

    def no_download(*args: object, **kwargs: object) -> Path:
        raise DataError("download disabled in this test")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setattr(fedforge.data.mnist, "download", no_download)

    argv = ["run", "-c", str(tiny_config), "--data-dir", str(empty_data)]
    assert main([*argv, "--runs-dir", str(runs), "-q"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "MNIST not found" in line and str(empty_data) in line
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.all_cores
def test_a_quiet_run_still_says_what_it_does_differently(
    tiny_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signalled: Callable[[int], None],
) -> None:
    """-q drops the progress bar, not the one-line notes (they were hidden too)."""
    argv = ["run", "-c", str(tiny_config), "--runs-dir", str(tmp_path), "-q"]
    assert main([*argv, "--set", "algorithm=scaffold", "--set", "workers=2"]) == 0
    assert "workers: 2 cannot be used" in capsys.readouterr().err


def test_run_in_process_on_tiny_data(
    tiny_config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    make_data: MakeData,
) -> None:
    # The data loader is swapped for four tiny float32 clients: the CLI path is the same.
    data = make_data([5, 6, 7, 8], dtype=torch.float32)
    monkeypatch.setattr(fedforge.data.federated, "load_federated_data", lambda cfg: data)
    runs = tmp_path / "runs"
    assert main(["run", "-c", str(tiny_config), "--runs-dir", str(runs), "-q"]) == 0
    out, err = capsys.readouterr()
    assert "fedforge: fedavg 2nn on mnist, 4 clients (iid partition), C=0.5" in out
    assert "rounds done      2" in out
    (run_dir,) = runs.iterdir()
    assert str(run_dir) in out
    with RunStore.open(run_dir) as store:
        assert len(store.rounds()) == 2
        assert [c.round_idx for c in store.client_rounds()] == [0, 0, 1, 1]
        assert store.status == "finished"


def test_runs_on_an_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "no runs"


def test_show_unknown_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "nosuchrun", "--runs-dir", str(tmp_path)]) == 2
    assert "'nosuchrun'" in one_error_line(capsys.readouterr().err)


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


def test_end_to_end_subprocess(
    mnist_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    env = {**os.environ, "FEDFORGE_DATA": str(mnist_dir), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "fedforge.cli", "run"]
    for item in ("model=2nn", "rounds=1", "num_clients=10", "client_fraction=0.2"):
        cmd += ["--set", item]
    cmd += ["--runs-dir", str(runs), "-q"]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "rounds done      1" in proc.stdout

    (run_dir,) = runs.iterdir()
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "store.sqlite").is_file()
    cfg = load(run_dir / "config.yaml")
    assert (cfg.model, cfg.rounds, cfg.num_clients, cfg.client_fraction) == ("2nn", 1, 10, 0.2)
    assert cfg == Config(
        model="2nn", rounds=1, num_clients=10, client_fraction=0.2, runs_dir=str(runs)
    )
    with RunStore.open(run_dir) as store:
        assert store.status == "finished"
        assert len(store.rounds()) == 1
        clients = store.client_rounds()
        assert len(clients) == 2
        # IID over 10 clients: 6,000 of MNIST's 60,000 training examples each.
        assert [c.num_examples for c in clients] == [6000, 6000]
        accuracy = store.rounds()[0].test_accuracy
        assert accuracy is not None and accuracy > 0.5

    assert main(["runs", "--runs-dir", str(runs)]) == 0
    assert run_dir.name in capsys.readouterr().out
    assert main(["show", run_dir.name, "--runs-dir", str(runs)]) == 0
    assert run_dir.name in capsys.readouterr().out


def test_start_up_imports_no_cryptography_unless_a_run_masks() -> None:
    """Secure aggregation's ``cryptography`` costs ~0.1 s of start-up: importing the
    command, the experiment builder and the loop does not import it (a fresh
    interpreter); masking runs import it when they build (the secagg tests run them)."""
    code = (
        "import sys, fedforge.cli, fedforge.server.experiment, fedforge.server.loop;"
        "print('cryptography' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("first", "frozen"), [("", True), ("import torch;", False)])
def test_start_up_freezes_torch_objects_only_in_a_process_fedforge_starts(
    first: str, frozen: bool
) -> None:
    """A fresh process that loads fedforge's public names (as the command does
    before a command that needs torch) has torch's objects frozen out of the
    garbage collector's full collections; a caller that imported torch itself
    keeps its collector as it was."""
    code = f"{first}import gc, fedforge; fedforge.Config; print(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count = int(out.stdout.strip())
    assert (count > 100_000) if frozen else (count == 0)


class _Signals(SimulationEngine):
    """An engine wrapper that sends this process ``count`` SIGTERMs while round 1 runs."""

    name = "signals"

    def __init__(self, inner: object, count: int) -> None:
        self.inner, self.count = inner, count

    def run_cohort(self, tasks: list[object], payload: bytes) -> object:
        import signal
        import time

        if tasks and getattr(tasks[0], "round_idx", None) == 1:
            for _ in range(self.count):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)  # the handler runs between bytecodes
        return self.inner.run_cohort(tasks, payload)  # type: ignore[attr-defined]


@pytest.fixture
def signalled(monkeypatch: pytest.MonkeyPatch, make_data: MakeData) -> Callable[[int], None]:
    """Tiny data for the CLI, and an engine that gets ``count`` SIGTERMs in round 1."""
    from tests.conftest import wrap_engine

    data = make_data([5, 6, 7, 8], dtype=torch.float32)
    monkeypatch.setattr(fedforge.data.federated, "load_federated_data", lambda cfg: data)

    def arm(count: int) -> None:
        wrap_engine(monkeypatch, lambda engine: _Signals(engine, count))

    return arm


def test_a_second_signal_stops_at_once_and_says_how_to_resume(
    tiny_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signalled: Callable[[int], None],
) -> None:
    signalled(2)
    runs = tmp_path / "runs"
    argv = ["run", "-c", str(tiny_config), "--set", "rounds=4", "--set", "checkpoint_every=1"]
    assert main([*argv, "--runs-dir", str(runs), "-q"]) == 143  # 128 + SIGTERM
    (run_dir,) = runs.iterdir()
    hint = f"fedforge resume {run_dir}"
    assert "stopped at once by a second SIGTERM" in capsys.readouterr().err
    with RunStore.open(run_dir) as store:
        assert store.status == "failed" and store.info().status == "stopped"  # resumable
        assert hint in (store.summary() or {})["error"]


def test_a_stopped_sweep_exits_with_the_signal(
    tiny_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signalled: Callable[[int], None],
) -> None:
    signalled(1)  # the point finishes its round, checkpoints and stops
    runs = tmp_path / "runs"
    argv = ["sweep", str(tiny_config), "--set", "rounds=3", "--grid", "lr=0.1,0.2"]
    assert main([*argv, "--runs-dir", str(runs), "-q"]) == 143
    assert "(stopped)" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["sweep", "compare-iid"])
def test_a_signal_in_a_points_last_round_stops_after_that_point(
    tiny_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signalled: Callable[[int], None],
    command: str,
) -> None:
    """Round 1 is the last: the point finishes (nothing to resume), but the sweep
    or comparison must not go on to the next run (it did, and exited 0)."""
    signalled(1)
    runs = tmp_path / "runs"
    more = ["--grid", "lr=0.1,0.2"] if command == "sweep" else ["--set", "partition.kind=shards"]
    argv = [command, str(tiny_config), "--set", "rounds=2", *more]
    assert main([*argv, "--runs-dir", str(runs), "-q"]) == 143
    (only,) = list_runs(runs)
    assert only.status == "finished" and only.rounds_done == 2
    if command == "compare-iid":
        assert "the configured run did not start: stopped by SIGTERM" in capsys.readouterr().out


def test_runs_and_show_name_what_is_wrong(
    tiny_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    make_data: MakeData,
) -> None:
    import sqlite3

    data = make_data([5, 6, 7, 8], dtype=torch.float32)
    monkeypatch.setattr(fedforge.data.federated, "load_federated_data", lambda cfg: data)
    runs = tmp_path / "runs"
    for name in ("sig", "sig2"):  # 'sig' is a prefix of 'sig2': the exact name wins
        argv = ["run", "-c", str(tiny_config), "--set", f"name={name}", "--set", "rounds=1"]
        assert main([*argv, "--runs-dir", str(runs), "-q"]) == 0
    capsys.readouterr()
    assert main(["show", "sig", "--runs-dir", str(runs)]) == 0
    assert "sig2" not in capsys.readouterr().out
    assert main(["show", str(tmp_path), "--runs-dir", str(runs)]) == 2
    assert "is a directory but not a run" in one_error_line(capsys.readouterr().err)
    assert main(["runs", "--runs-dir", str(tmp_path / "nope")]) == 0
    assert "does not exist" in capsys.readouterr().out
    sig = next(p for p in runs.iterdir() if p.name.endswith("-sig-") or "-sig-" in p.name)
    with sqlite3.connect(sig / "store.sqlite") as conn:
        conn.execute("UPDATE runs SET config_json = 'not json'")
    assert main(["show", "sig", "--runs-dir", str(runs)]) == 2
    assert "unreadable config_json" in one_error_line(capsys.readouterr().err)

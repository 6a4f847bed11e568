"""A run is shown with the score its task is judged by: a regression run's best
R^2 is never printed as an accuracy in percent, in the end-of-run summary,
``fedforge runs`` and ``show``, the HTML report and ``compare``'s table, and the
dashboard's runs list and run status. The runs list also says each run's
algorithm and whether the simulator or a deployment ran it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedforge.cli import main
from fedforge.report.dashboard.data import runs_listing, status_view
from fedforge.store.runstore import RunStore

REGRESSION = ["--set", "task=linear-regression", "--set", "num_clients=4"]
REGRESSION += ["--set", "client_fraction=1.0", "--set", "rounds=3", "--set", "lr=0.05"]
REGRESSION += ["--set", "target_accuracy=null", "--set", "dtype=float64", "--set", "name=reg"]


def test_a_regression_run_is_shown_by_its_r2_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    assert main(["run", *REGRESSION, "--set", "algorithm=fedsgd", "--runs-dir", str(runs)]) == 0
    end = capsys.readouterr().out
    (run_dir,) = runs.iterdir()
    with RunStore.open(run_dir, read_only=True) as store:
        scores = [r.test_accuracy for r in store.rounds() if r.test_accuracy is not None]
    best = max(scores)
    shown = f"{best:.4f}"  # R^2 as it is, four decimals
    assert f"best R^2 {shown}" in end and "accuracy" not in end, end

    assert main(["runs", "--runs-dir", str(runs)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["RUN", "STATUS", "ALGORITHM", "MODE", "ROUNDS", "BEST", "CREATED"]
    assert row.split()[1:7] == ["finished", "fedsgd", "sim", "3/3", "R^2", shown]

    assert main(["show", run_dir.name, "--runs-dir", str(runs)]) == 0
    show = capsys.readouterr().out
    assert f"R^2       best {shown} (round " in show and "accuracy" not in show
    assert "fedsgd linear on regression, 4 clients, sim," in show

    page = tmp_path / "report.html"
    assert main(["report", str(run_dir), "-o", str(page)]) == 0
    html = page.read_text()
    assert f"R^2 {shown} (round " in html and "fedsgd (sim)" in html

    listed = runs_listing(runs)["runs"][0]
    assert (listed["algorithm"], listed["mode"], listed["best"]) == (
        "fedsgd",
        "sim",
        f"R^2 {shown}",
    )
    with RunStore.open(run_dir, read_only=True) as store:
        assert status_view(store)["best"] == f"R^2 {shown}"


def test_a_classification_run_is_shown_by_its_accuracy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    args = ["--set", "dataset=synthetic", "--set", "model=logreg", "--set", "num_clients=4"]
    args += ["--set", "rounds=2", "--set", "target_accuracy=null", "--set", "name=cls"]
    assert main(["run", *args, "--runs-dir", str(runs)]) == 0
    end = capsys.readouterr().out
    (run_dir,) = runs.iterdir()
    with RunStore.open(run_dir, read_only=True) as store:
        best = max(r.test_accuracy for r in store.rounds() if r.test_accuracy is not None)
    assert f"best accuracy {100 * best:.2f}%" in end
    assert main(["runs", "--runs-dir", str(runs)]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[2:7] == ["fedavg", "sim", "2/2", "acc", f"{100 * best:.2f}%"]


def test_a_regression_sweep_tables_its_r2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "reg.yaml"
    config.write_text(
        "task: linear-regression\nnum_clients: 4\nclient_fraction: 1.0\nrounds: 2\n"
        f"target_accuracy: null\ndtype: float64\nname: regsweep\nruns_dir: {tmp_path / 'runs'}\n"
    )
    assert main(["sweep", str(config), "--grid", "lr=0.02,0.05"]) == 0
    table = capsys.readouterr().out
    bests = []
    for run_dir in sorted((tmp_path / "runs").iterdir()):
        with RunStore.open(run_dir, read_only=True) as store:
            bests.append(
                max(r.test_accuracy for r in store.rounds() if r.test_accuracy is not None)
            )
    for best in bests:
        assert f"R^2 {best:.4f}" in table
    assert "%" not in table

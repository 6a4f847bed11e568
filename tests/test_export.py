"""``fedforge export``: a real (tiny, DP) run written for TensorBoard and MLflow and
read back with each tool's own reader (TensorBoard's EventAccumulator, MLflow's
client on a file store in tmp_path); every series equals the store's rows as
plain sqlite3 reads them (float32 in TensorBoard, exactly in MLflow), the config
arrives as hyper-parameters and the summary as metrics. A second export of the
same run is refused (also of a run whose name holds a quote); an alert rule's
secret reaches neither tool; a config of a newer fedforge is exported as
stored; a missing library names the extra that installs it."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from tests.conftest import _make_data
from tests.report_pages import SECRET

from fedforge.cli import main
from fedforge.config import from_dict
from fedforge.server.loop import run

pytestmark = pytest.mark.usefixtures("one_thread")

# metric: the SQL that reads its (step, value) rows from the store
SQL = {
    "test/accuracy": "SELECT round_idx + 1, test_accuracy FROM rounds",
    "test/loss": "SELECT round_idx + 1, test_loss FROM rounds",
    "train/loss": "SELECT round_idx + 1, train_loss FROM rounds",
    "bytes/up": "SELECT round_idx + 1, bytes_up FROM rounds",
    "bytes/down": "SELECT round_idx + 1, bytes_down FROM rounds",
    "round/seconds": "SELECT round_idx + 1, seconds FROM rounds",
    "privacy/epsilon": "SELECT round_idx + 1, epsilon FROM privacy",
    "diagnostics/mean_cosine": "SELECT round_idx + 1, mean_cosine FROM diagnostics",
    "diagnostics/norm_max": "SELECT round_idx + 1, norm_max FROM diagnostics",
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-round central-DP run, evaluated after rounds 2 and 3 (not 1)."""
    cfg = from_dict(
        {
            "name": "exported",
            "model": "2nn",
            "num_clients": 4,
            "client_fraction": 1.0,
            "batch_size": None,
            "rounds": 3,
            "evaluation": {"every": 2},
            "target_accuracy": None,
            "dtype": "float64",
            "checkpoint_every": 0,
            "threads": 1,  # the module's run, before the tests' one_thread
            "runs_dir": str(tmp_path_factory.mktemp("runs")),
            "privacy": {"dp": "central", "target_epsilon": 50.0},
        }
    )
    result = run(cfg, data=_make_data([6, 5, 7, 6]))
    assert result.run_dir is not None
    return result.run_dir


def _rows(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    with sqlite3.connect(run_dir / "store.sqlite") as conn:
        rows = conn.execute(SQL[metric] + " ORDER BY round_idx").fetchall()
    return [(int(step), float(value)) for step, value in rows if value is not None]


def test_tensorboard_scalars_are_the_store_rows(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    logdir = tmp_path / "tb"
    assert main(["export", str(run_dir), "--tensorboard", str(logdir)]) == 0
    acc = EventAccumulator(str(logdir / run_dir.name), size_guidance={"scalars": 0})
    acc.Reload()
    assert _rows(run_dir, "test/accuracy")[0][0] == 2  # round 1 was not evaluated
    for metric in SQL:
        want = [(step, float(np.float32(value))) for step, value in _rows(run_dir, metric)]
        assert want, metric
        assert [(e.step, e.value) for e in acc.Scalars(metric)] == want, metric
    summary = json.loads(_summary_json(run_dir))
    assert acc.Scalars("summary/best_accuracy")[0].value == np.float32(summary["best_accuracy"])
    assert acc.Scalars("summary/best_accuracy")[0].step == 3
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["privacy.target_epsilon"].number_value == 50.0
    assert hparams["model"].string_value == "2nn"
    assert hparams["batch_size"].string_value == "null"
    capsys.readouterr()
    _refused(capsys, ["export", str(run_dir), "--tensorboard", str(logdir)], ["already holds"])


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]) -> None:
    """``fedforge ARGV`` exits 2 with one error line holding ``words``."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedforge: error: "), err
    assert all(w in err for w in words), err


def _summary_json(run_dir: Path) -> str:
    with sqlite3.connect(run_dir / "store.sqlite") as conn:
        return str(conn.execute("SELECT summary_json FROM runs").fetchone()[0])


def test_mlflow_metrics_and_params_are_the_store_rows(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.7+ asks for it
    uri = (tmp_path / "mlruns").as_uri()
    argv = ["export", str(run_dir), "--mlflow", uri, "--experiment", "tiny"]
    assert main(argv) == 0
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tiny")
    assert experiment is not None
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == run_dir.name and found.info.status == "FINISHED"
    assert found.data.tags["fedforge.run"] == run_dir.name
    for metric in SQL:
        history = client.get_metric_history(found.info.run_id, metric)
        assert [(m.step, m.value) for m in history] == _rows(run_dir, metric), metric
    summary = json.loads(_summary_json(run_dir))
    assert found.data.metrics["summary/best_accuracy"] == summary["best_accuracy"]
    assert found.data.metrics["summary/privacy.epsilon"] == summary["privacy"]["epsilon"]
    params = found.data.params
    assert params["lr"] == "0.1" and params["model"] == "2nn" and params["batch_size"] == "null"
    assert params["privacy.dp"] == "central" and params["privacy.target_epsilon"] == "50.0"
    _refused(capsys, argv, ["already in MLflow experiment 'tiny'", found.info.run_id])


def test_the_mlflow_file_store_refusal_is_one_line(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import mlflow

    if tuple(int(p) for p in mlflow.__version__.split(".")[:2]) < (3, 7):
        pytest.skip("MLflow before 3.7 opens a file store without asking")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    argv = ["export", str(run_dir), "--mlflow", (tmp_path / "m").as_uri()]
    _refused(capsys, argv, ["MLFLOW_ALLOW_FILE_STORE=true"])


@pytest.mark.parametrize(
    "missing, flag, extra",
    [("torch.utils.tensorboard", "--tensorboard", "tensorboard"), ("mlflow", "--mlflow", "mlflow")],
)
def test_a_missing_library_names_its_extra(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    missing: str,
    flag: str,
    extra: str,
) -> None:
    for name in [m for m in sys.modules if m == missing or m.startswith(missing + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)  # what an import finds when absent
    argv = ["export", str(run_dir), flag, str(tmp_path / "x")]
    _refused(capsys, argv, [f"pip install 'fedforge[{extra}]'"])


def test_export_needs_a_destination(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, ["export", str(run_dir)], ["--tensorboard DIR and/or --mlflow URI"])
    argv = ["export", str(run_dir), "--experiment", "x", "--tensorboard", "y"]
    _refused(capsys, argv, ["--experiment", "--mlflow"])


def test_no_export_holds_an_alert_rules_secret(
    report_runs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every file TensorBoard and MLflow are given (events, params, tags,
    artifacts) is free of the secret in the run's alert rule URL and command."""
    run = report_runs["robust"]
    assert SECRET in (run / "config.yaml").read_text()  # the run keeps it, to resume
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    out = tmp_path / "out"
    argv = ["export", str(run), "--tensorboard", str(out / "tb"), "--mlflow"]
    assert main([*argv, (out / "mlruns").as_uri(), "--experiment", "secrets"]) == 0
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name.startswith("events.out.tfevents.") for p in written)
    assert [p for p in written if p.name.startswith("alerts.rules")]  # the params, one a file
    assert [p.name for p in written if SECRET.encode() in p.read_bytes()] == []
    (artifact,) = [p for p in written if p.name == "config.yaml"]
    rule = yaml.safe_load(artifact.read_text())["alerts"]["rules"][2]
    assert rule["url"] == "https://hooks.example.com:8443/…"
    assert rule["command"] == ["notify", "…"]


def test_a_run_whose_name_holds_a_quote_is_exported_once(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    quoted = tmp_path / "20250101-000000-o'brien-a1b2c3"
    shutil.copytree(run_dir, quoted)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    argv = ["export", str(quoted), "--mlflow", (tmp_path / "mlruns").as_uri()]
    assert main(argv) == 0
    assert "o'brien" in capsys.readouterr().out
    _refused(capsys, argv, ["run 20250101-000000-o'brien-a1b2c3 is already in MLflow"])


def test_a_config_of_a_newer_fedforge_is_exported_as_stored(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    newer = tmp_path / run_dir.name
    shutil.copytree(run_dir, newer)
    with sqlite3.connect(newer / "store.sqlite") as conn:
        (text,) = conn.execute("SELECT config_json FROM runs").fetchone()
        data = {**json.loads(text), "from_the_future": {"knob": 3}}
        conn.execute("UPDATE runs SET config_json = ?", (json.dumps(data),))
    logdir = tmp_path / "tb"
    assert main(["export", str(newer), "--tensorboard", str(logdir)]) == 0
    err = capsys.readouterr().err
    assert "cannot rebuild the run's config" in err and "from_the_future" in err
    acc = EventAccumulator(str(logdir / newer.name), size_guidance={"scalars": 0})
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["from_the_future.knob"].number_value == 3
    assert [e.step for e in acc.Scalars("test/accuracy")] == [
        s for s, _ in _rows(newer, "test/accuracy")
    ]

"""Resume runs with the config stored in the run's database: a hand-edited
``config.yaml`` beside it is not read, and resume says so in one line, naming
the fields that differ."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.conftest import wrap_engine
from tests.test_cli import TINY, _Signals

import fedforge.data.federated
from fedforge.cli import main
from fedforge.config import Config, PartitionConfig, dump
from fedforge.data.federated import FederatedData
from fedforge.store import RunStore
from fedforge.store.edited import edited_config_note

MakeData = Callable[..., FederatedData]

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_note_names_the_fields_that_differ(tmp_path: Path) -> None:
    stored = Config(name="x", lr=0.1)
    path = tmp_path / "config.yaml"
    path.write_text(dump(stored))
    assert edited_config_note(tmp_path, stored) is None
    path.write_text(dump(Config(name="x", lr=0.5, partition=PartitionConfig(kind="shards"))))
    note = edited_config_note(tmp_path, stored)
    assert note is not None and "\n" not in note
    assert "differs from the stored config in 2 fields" in note
    assert "lr: 0.1 -> 0.5" in note and "partition.kind: 'iid' -> 'shards'" in note
    assert "the config stored in the run is the one used" in note
    path.write_text("lr: [\n")
    assert "does not load" in (edited_config_note(tmp_path, stored) or "")
    path.unlink()
    assert "is missing" in (edited_config_note(tmp_path, stored) or "")


def test_resume_says_an_edited_config_yaml_is_not_read(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    make_data: MakeData,
) -> None:
    data = make_data([5, 6, 7, 8], dtype=torch.float32)
    monkeypatch.setattr(fedforge.data.federated, "load_federated_data", lambda cfg: data)
    wrap_engine(monkeypatch, lambda engine: _Signals(engine, 1))  # a SIGTERM in round 2
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    runs = tmp_path / "runs"
    argv = ["run", "-c", str(config), "--set", "rounds=4", "--set", "checkpoint_every=1"]
    assert main([*argv, "--runs-dir", str(runs), "-q"]) == 143
    (run_dir,) = runs.iterdir()
    edited = (run_dir / "config.yaml").read_text()
    edited = edited.replace("lr: 0.1\n", "lr: 0.5\n").replace("rounds: 4\n", "rounds: 9\n")
    (run_dir / "config.yaml").write_text(edited)
    capsys.readouterr()
    assert main(["resume", run_dir.name, "--runs-dir", str(runs), "-q"]) == 0
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if "config.yaml" in x]
    assert "differs from the stored config in 2 fields (lr: 0.1 -> 0.5; rounds: 4 -> 9)" in line
    assert "the config stored in the run is the one used" in line
    with RunStore.open(run_dir) as store:
        assert store.status == "finished" and len(store.rounds()) == 4  # the stored rounds
        assert store.config().lr == 0.1

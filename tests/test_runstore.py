"""Tests of the run store: layout, transactions, crash survival, listing and lookup."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedforge.config import Config, load
from fedforge.core.errors import StoreError
from fedforge.report.runs import format_run_summary, format_run_table
from fedforge.store import (
    ClientRecord,
    RoundRecord,
    RunStore,
    list_runs,
    resolve_run,
)
from fedforge.store.directory import config_name


def _round(idx: int, acc: float | None = 0.5, loss: float = 1.0) -> RoundRecord:
    return RoundRecord(
        round_idx=idx,
        cohort_size=2,
        train_loss=loss,
        test_accuracy=acc,
        test_loss=None if acc is None else 0.3,
        bytes_up=1000,
        bytes_down=2000,
        paper_bytes=800,
        lr=0.1,
        seconds=1.5,
    )


def _clients(idx: int, ids: tuple[int, ...] = (3, 7)) -> list[ClientRecord]:
    return [ClientRecord(idx, cid, 600, 0.9, 0.25, 500, 1000) for cid in ids]


def test_create_writes_layout_and_reopens(tmp_path: Path) -> None:
    cfg = Config(name="mnist-cnn", rounds=5, local_epochs=5)
    with RunStore.create(tmp_path / "runs", cfg) as store:
        path = store.path
        assert path.parent == tmp_path / "runs"
        assert config_name(path) == "mnist-cnn"
        assert path.name.split("-")[2:4] == ["mnist", "cnn"]
        for name in ("config.yaml", "store.sqlite", "metrics.jsonl"):
            assert (path / name).is_file()
        assert load(path / "config.yaml") == cfg
        assert store.status == "running" and store.summary() is None
        store.record_round(_round(0, 0.5), _clients(0))
        store.record_round(_round(1, 0.7), _clients(1, (1, 2, 9)))
        store.finish({"rounds_to_target": 1, "wall_seconds": 3.0})
    with sqlite3.connect(path / "store.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with RunStore.open(path) as store:
        assert store.config() == cfg
        assert store.status == "finished"
        assert store.summary() == {"rounds_to_target": 1, "wall_seconds": 3.0}
        rounds = store.rounds()
        assert [r.round_idx for r in rounds] == [0, 1]
        assert rounds[1].test_accuracy == 0.7 and rounds[0].created is not None
        assert rounds[0] == RoundRecord(**{**_round(0).__dict__, "created": rounds[0].created})
        assert store.client_rounds(1) == _clients(1, (1, 2, 9))
        assert len(store.client_rounds()) == 5
    lines = (path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round_idx"] for line in lines] == [0, 1]
    assert json.loads(lines[0])["test_accuracy"] == 0.5


def test_rerun_of_a_round_replaces_it(tmp_path: Path) -> None:
    with RunStore.create(tmp_path, Config(name="r")) as store:
        store.record_round(_round(0, 0.1), _clients(0, (1, 2, 3)))
        store.record_round(_round(0, 0.2), _clients(0, (4,)))
        assert [r.test_accuracy for r in store.rounds()] == [0.2]
        assert [c.client_id for c in store.client_rounds()] == [4]


def test_failure_mid_round_leaves_nothing_of_it(tmp_path: Path) -> None:
    with RunStore.create(tmp_path, Config(name="t")) as store:
        store.record_round(_round(0, 0.4), _clients(0))
        # the round row goes in, then the second client row violates the primary key
        with pytest.raises(StoreError, match="cannot record round 2"):
            store.record_round(_round(1), _clients(1, (5, 5)))
        assert [r.round_idx for r in store.rounds()] == [0]
        assert all(c.round_idx == 0 for c in store.client_rounds())
        # a failed re-run of round 0 keeps the earlier copy intact
        bad = [ClientRecord(0, 1, object(), 0.1, 0.1, 1, 1)]  # type: ignore[arg-type]
        with pytest.raises(StoreError):
            store.record_round(_round(0, 0.9), bad)
        assert [r.test_accuracy for r in store.rounds()] == [0.4]
        assert [c.client_id for c in store.client_rounds(0)] == [3, 7]
        # only committed rounds reach the metrics stream, and the store still works
        store.record_round(_round(1), _clients(1))
        assert len((store.path / "metrics.jsonl").read_text().splitlines()) == 2
        with pytest.raises(StoreError, match="not from round 3"):
            store.record_round(_round(2), _clients(1))


def test_killed_writer_leaves_committed_rounds(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, sys
        from fedforge.config import Config
        from fedforge.store import ClientRecord, RoundRecord, RunStore
        store = RunStore.create({str(tmp_path)!r}, Config(name="killed", rounds=10))
        for i in range(2):
            store.record_round(
                RoundRecord(i, 1, 0.5, 0.8 + i / 100, 0.2, 10, 20, 8, 0.1, 0.01),
                [ClientRecord(i, 0, 50, 0.5, 1.0, 10, 20)],
            )
        print(store.path, flush=True)
        os._exit(9)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 9, proc.stderr
    path = Path(proc.stdout.strip())
    with RunStore.open(path) as store:
        assert [r.round_idx for r in store.rounds()] == [0, 1]
        assert len(store.client_rounds()) == 2
        assert store.status == "running"
        store.record_round(_round(2), _clients(2))  # a resumed run can carry on writing
    (info,) = list_runs(tmp_path)  # 'running' in the store, but no process holds it
    assert (info.status, info.rounds_done, info.rounds_planned) == ("died", 3, 10)
    assert info.best_accuracy == pytest.approx(0.81)
    from fedforge.server.state import RunLock

    lock = RunLock(path).acquire()  # a live writer
    try:
        assert list_runs(tmp_path)[0].status == "running"
    finally:
        lock.release()


def test_open_rejects_non_runs(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        RunStore.open(tmp_path / "nope")
    with pytest.raises(StoreError, match="not a run directory"):
        RunStore.open(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "store.sqlite").write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreError, match="corrupt"):
        RunStore.open(bad)
    other = tmp_path / "other"
    other.mkdir()
    sqlite3.connect(other / "store.sqlite").execute("CREATE TABLE runs (x)").connection.close()
    with pytest.raises(StoreError, match="corrupt"):
        RunStore.open(other)


def test_a_newer_store_says_so_and_a_renamed_run_lists_by_its_directory(tmp_path: Path) -> None:
    (path,) = _make_runs(tmp_path, ["alpha"])
    renamed = path.with_name(path.name.replace("alpha", "beta"))
    path.rename(renamed)
    (info,) = list_runs(tmp_path)
    assert info.run_id == renamed.name  # what `show` and `resume` take
    conn = sqlite3.connect(renamed / "store.sqlite")
    conn.execute("PRAGMA user_version = 9")
    conn.close()
    with pytest.raises(StoreError, match=r"newer fedforge \(schema version 9; this one reads 1"):
        RunStore.open(renamed)


def test_a_read_only_run_lists_and_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store this process may not write (an archive, another user's run) opens
    read-only; it was called 'unreadable', because WAL mode is a write."""
    with RunStore.create(tmp_path, Config(name="kept")) as store:
        store.record_round(_round(0, 0.7), _clients(0))
        store.finish({"wall_seconds": 2.0})
        path = store.path
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode & os.W_OK else real(p, mode))
    (info,) = list_runs(tmp_path)
    assert (info.status, info.rounds_done, info.best_accuracy) == ("finished", 1, 0.7)
    with RunStore.open(path) as store:
        assert "best 70.00%" in format_run_summary(store)
        with pytest.raises(StoreError):
            store.record_round(_round(1), [])


def _make_runs(root: Path, names: list[str]) -> list[Path]:
    paths = []
    for name in names:
        with RunStore.create(root, Config(name=name)) as store:
            paths.append(store.path)
    return paths


def test_list_runs_skips_non_runs_and_marks_corrupt(tmp_path: Path) -> None:
    assert list_runs(tmp_path / "missing") == []
    paths = _make_runs(tmp_path, ["alpha", "beta"])
    (tmp_path / "notes").mkdir()
    (tmp_path / "file.txt").write_text("x")
    broken = tmp_path / "20200101-000000-broken-abcdef"
    broken.mkdir()
    (broken / "store.sqlite").write_bytes(b"garbage" * 200)
    runs = list_runs(tmp_path)
    assert {r.path for r in runs} == {*paths, broken}
    status = {r.name: r.status for r in runs}
    assert status == {"alpha": "died", "beta": "died", "broken": "unreadable"}  # no writer
    table = format_run_table(runs)
    assert table.splitlines()[0].split()[:5] == ["RUN", "STATUS", "ALGORITHM", "MODE", "ROUNDS"]
    assert paths[0].name in table and "unreadable" in table
    assert format_run_table([]) == "no runs"


def test_a_store_with_damaged_schema_bytes_is_a_store_error(tmp_path: Path) -> None:
    """A bad disk or copy: SQLite's message quotes the damaged schema text, which
    is not UTF-8, and Python raised UnicodeDecodeError out of show and resume."""
    (path,) = _make_runs(tmp_path, ["damaged"])
    db = path / "store.sqlite"
    data = db.read_bytes()
    at = data.index(b"CREATE TABLE")
    db.write_bytes(data[:at] + b"CREATE TA\xb3LE" + data[at + 12 :])
    with pytest.raises(StoreError, match="is corrupt or (unreadable|not a run)"):
        RunStore.open(path)
    (run,) = list_runs(tmp_path)
    assert run.status == "unreadable"


def test_resolve_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = _make_runs(tmp_path, ["mnist-iid", "mnist-noniid", "shakespeare"])
    assert resolve_run(tmp_path, a) == a
    assert resolve_run(tmp_path, str(b)) == b
    assert resolve_run(tmp_path, a.name) == tmp_path / a.name
    assert resolve_run(tmp_path, a.name[-6:]) == a  # the random suffix
    assert resolve_run(tmp_path, "shake") == c  # a prefix of the config name
    assert resolve_run(tmp_path, "mnist-non") == b
    with pytest.raises(StoreError, match="ambiguous") as err:
        resolve_run(tmp_path, "mnist")
    assert a.name in str(err.value) and b.name in str(err.value)
    with pytest.raises(StoreError, match="ambiguous"):
        resolve_run(tmp_path, a.name[:8])  # the shared date prefix
    with pytest.raises(StoreError, match="no run matches 'cifar'") as err:
        resolve_run(tmp_path, "cifar")
    assert c.name in str(err.value)
    with pytest.raises(StoreError, match="empty"):
        resolve_run(tmp_path, "")
    monkeypatch.chdir(tmp_path)
    assert resolve_run("elsewhere", a.name) == Path(a.name)


def test_a_nan_train_loss_reads_back_as_nan(tmp_path: Path) -> None:
    """SQLite stores NaN as NULL: a resumed run's earlier rounds must read as the
    uninterrupted run had them (NaN: a local round, a skipped one), not None."""
    with RunStore.create(tmp_path, Config(name="nan")) as store:
        store.record_round(dataclasses.replace(_round(0, None), train_loss=math.nan), [])
        store.record_round(_round(1, 0.5), _clients(1))
        first, second = store.rounds()
    assert math.isnan(first.train_loss) and first.test_accuracy is None
    assert second.train_loss == _round(1, 0.5).train_loss


def test_format_run_summary(tmp_path: Path) -> None:
    cfg = Config(name="show", rounds=20, batch_size=None, client_fraction=0.1)
    with RunStore.create(tmp_path, cfg) as store:
        store.record_round(_round(0, 0.91), _clients(0))
        store.record_round(_round(1, None), _clients(1))
        store.record_round(_round(2, 0.95), _clients(2))
        store.record_round(_round(3, 0.93), _clients(3))
        text = format_run_summary(store)
        assert "4 of 20" in text and "B=all" in text and "C=0.1" in text
        assert "best 95.00% (round 3)" in text and "final 93.00% (round 4)" in text  # from 1
        assert "up 3.9 KiB, down 7.8 KiB" in text
        assert "0m 06s" in text  # the sum of round seconds
        # 'running' in the store, and no process holds its lock: it died
        assert "[died]" in text and f"resume with: fedforge resume {store.path}" in text
        assert "target" not in text
        store.finish({"rounds_to_target": 3, "wall_seconds": 3725.0}, status="failed")
        text = format_run_summary(store)
        assert "[failed]" in text and "reached in 3.0 rounds" in text and "1h 02m 05s" in text
        with pytest.raises(StoreError, match="allowed"):
            store.finish({}, status="done")


@pytest.mark.parametrize(
    ("summary", "shown"),
    [
        (
            {"stopped": "SIGTERM", "error": "stopped by SIGTERM before round 4; resume with: x"},
            "stopped",
        ),
        ({"error": "stopped by SIGINT before round 2; resume with: x"}, "stopped"),  # older store
        ({"error": "run stopped: interrupted; resume with: x"}, "failed"),  # a second signal
        ({"error": "run stopped: EngineError: worker 1 died; resume with: x"}, "failed"),
    ],
)
def test_a_clean_signal_stop_is_shown_stopped_not_failed(
    tmp_path: Path, summary: dict[str, str], shown: str
) -> None:
    with RunStore.create(tmp_path, Config(name="sig", rounds=6)) as store:
        store.record_round(_round(0, 0.91), _clients(0))
        store.finish(summary, status="failed")
        assert store.status == "failed"  # what the database holds
        assert store.info().status == shown
        assert f"[{shown}]" in format_run_summary(store)
        assert f"stopped   {summary['error']}" in format_run_summary(store)
        assert format_run_table([store.info()]).splitlines()[1].split()[1] == shown


def test_show_says_why_a_finished_run_stopped_early(tmp_path: Path) -> None:
    with RunStore.create(tmp_path, Config(name="stall", rounds=6)) as store:
        store.record_round(_round(0, 0.1), [])
        store.finish({"stall_stop": "stopped after 2 skipped rounds in a row (...)"})
        text = format_run_summary(store)
    assert "[finished]" in text and "stopped   stopped after 2 skipped rounds" in text


@pytest.mark.parametrize("column", ["test_accuracy", "bytes_up"])
def test_a_hand_damaged_rounds_table_is_one_unreadable_run(tmp_path: Path, column: str) -> None:
    """SQLite keeps text in a number column: a text accuracy made `fedforge runs`
    fail for every run, a text byte count made `show` a TypeError traceback."""
    with RunStore.create(tmp_path, Config(name="good")) as store:
        store.record_round(_round(0, 0.7), _clients(0))
    with RunStore.create(tmp_path, Config(name="bad")) as store:
        store.record_round(_round(0, 0.6), _clients(0))
        bad = store.path
    with sqlite3.connect(bad / "store.sqlite") as db:
        db.execute(f"UPDATE rounds SET {column} = 'abc'")
    runs = {r.name: r for r in list_runs(tmp_path)}
    assert runs["good"].best_accuracy == 0.7
    if column == "test_accuracy":
        assert runs["bad"].status == "unreadable"
    assert "good" in format_run_table(list(runs.values()))
    with RunStore.open(bad) as store, pytest.raises(StoreError, match="damaged rounds table"):
        format_run_summary(store)

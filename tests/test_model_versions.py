"""Tests of the run store's model versions: the round trip of parameters, the
promote/rollback state machine and its refusals, crash safety, damaged files,
and ``fedforge models``."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedforge.cli import main
from fedforge.config import Config
from fedforge.core.errors import StoreError
from fedforge.store import RunStore
from fedforge.store import versions as versions_module
from fedforge.store.versions import (
    add_version,
    canary,
    get_version,
    list_versions,
    load_version_params,
    promote,
    rollback,
    serving,
    start_canary,
    update_metrics,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore.create(tmp_path / "runs", Config(name="versions")) as s:
        yield s


def _params(n: int = 6, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _statuses(store: RunStore) -> dict[int, str]:
    return {v.version_id: v.status for v in list_versions(store)}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_add_list_get_load_round_trip(store: RunStore, dtype: torch.dtype) -> None:
    first = torch.tensor([1.5, -0.0, float("nan"), float("inf"), 1e-30], dtype=dtype)
    second = _params(12, dtype).reshape(3, 4)
    before = time.time()
    v1 = add_version(store, first, round_idx=9, metrics={"accuracy": 0.5}, status="promoted")
    v2 = add_version(store, second, 19, parent_id=1, metrics={"accuracy": 0.75, "loss": 1})
    assert (v1.version_id, v1.parent_id, v1.round_idx, v1.status) == (1, None, 9, "promoted")
    assert (v2.version_id, v2.parent_id, v2.round_idx, v2.status) == (2, 1, 19, "candidate")
    assert v2.metrics == {"accuracy": 0.75, "loss": 1.0}
    assert before <= v1.created <= v2.created <= time.time()
    assert list_versions(store) == [v1, v2] and get_version(store, 2) == v2
    assert serving(store) == v1 and canary(store) is None
    assert (store.path / "versions" / "v1.safetensors").is_file()
    for version, want in ((1, first), (2, second)):
        got = load_version_params(store, version)
        assert got.dtype == dtype and got.shape == want.shape
        assert torch.equal(_bits(got), _bits(want))  # bit for bit: NaN and -0.0 too
    with RunStore.open(store.path, read_only=True) as reader:  # a reader sees the same
        assert list_versions(reader) == [v1, v2]
        assert torch.equal(_bits(load_version_params(reader, 2)), _bits(second))


def test_a_store_without_versions_and_bad_arguments(store: RunStore) -> None:
    assert list_versions(store) == [] and serving(store) is None
    with pytest.raises(StoreError, match="has no model version 1 .it has no model versions"):
        get_version(store, 1)
    with pytest.raises(StoreError, match="no model version 3"):
        load_version_params(store, 3)
    with pytest.raises(StoreError, match="status 'superseded' is invalid"):
        add_version(store, _params(), 0, status="superseded")
    with pytest.raises(StoreError, match="metric 'acc' = 'high' is invalid"):
        add_version(store, _params(), 0, metrics={"acc": "high"})  # type: ignore[dict-item]
    with pytest.raises(StoreError, match="parent 4: .* no model version 4"):
        add_version(store, _params(), 0, parent_id=4)
    assert list_versions(store) == []


def test_promote_supersedes_and_rollback_returns_to_the_parent(store: RunStore) -> None:
    add_version(store, _params(seed=1), 0, status="promoted")
    add_version(store, _params(seed=2), 10, parent_id=1)
    assert start_canary(store, 2).status == "canary"
    assert canary(store) == get_version(store, 2)
    assert promote(store, 2).status == "promoted"
    assert _statuses(store) == {1: "superseded", 2: "promoted"}
    assert promote(store, 2).status == "promoted"  # already serving: no change
    rolled, now = rollback(store)  # no canary: the serving version
    assert (rolled.version_id, rolled.status, now.version_id, now.status) == (
        2,
        "rolled_back",
        1,
        "promoted",
    )
    assert _statuses(store) == {1: "promoted", 2: "rolled_back"}
    assert serving(store) == get_version(store, 1)
    assert torch.equal(load_version_params(store, 1), _params(seed=1))


def test_refusals_name_the_version_and_its_status(store: RunStore) -> None:
    add_version(store, _params(), 0, status="promoted")
    add_version(store, _params(), 1, parent_id=1, status="canary")
    rollback(store, 2)
    before = _statuses(store)
    with pytest.raises(StoreError, match="promote version 2: its status is rolled_back"):
        promote(store, 2)
    with pytest.raises(StoreError, match="no model version 7 .it has versions 1 to 2"):
        promote(store, 7)
    with pytest.raises(StoreError, match="roll back version 1: nothing to roll back to .no parent"):
        rollback(store, 1)
    with pytest.raises(StoreError, match="roll back version 2: its status is rolled_back"):
        rollback(store, 2)
    with pytest.raises(StoreError, match="version 2 the canary: its status is rolled_back"):
        start_canary(store, 2)
    add_version(store, _params(), 2, parent_id=1, status="canary")
    with pytest.raises(StoreError, match="version 4 the canary: version 3 is in canary"):
        add_version(store, _params(), 3, parent_id=1, status="canary")
    assert _statuses(store) == {**before, 3: "canary"}  # the refused version was not added


def test_a_canary_rollback_keeps_the_serving_version(store: RunStore) -> None:
    add_version(store, _params(), 0, status="promoted")
    add_version(store, _params(), 5, parent_id=1, status="canary")
    rolled, now = rollback(store)  # the canary first
    assert (rolled.version_id, now.version_id) == (2, 1)
    assert _statuses(store) == {1: "promoted", 2: "rolled_back"}
    with pytest.raises(StoreError, match="nothing to roll back to .no parent"):
        rollback(store)  # now the serving version, which has nothing before it
    assert _statuses(store) == {1: "promoted", 2: "rolled_back"}


def test_rollback_skips_ancestors_never_served_or_rolled_back(store: RunStore) -> None:
    add_version(store, _params(), 0, status="promoted")  # 1
    add_version(store, _params(), 1, parent_id=1, status="canary")  # 2, rolled back
    rollback(store, 2)
    add_version(store, _params(), 2, parent_id=2)  # 3: a candidate never served
    add_version(store, _params(), 3, parent_id=3)  # 4
    promote(store, 4)
    assert rollback(store, 4)[1].version_id == 1  # past 3 (candidate) and 2 (rolled back)
    assert _statuses(store) == {1: "promoted", 2: "rolled_back", 3: "candidate", 4: "rolled_back"}
    promote(store, 3)  # 1 superseded, 3 serving
    assert rollback(store)[1].version_id == 1  # past 2 (rolled back)


def test_rollback_without_an_ancestor_that_served(store: RunStore) -> None:
    add_version(store, _params(), 0)  # 1: never served
    add_version(store, _params(), 1, parent_id=1, status="promoted")
    with pytest.raises(
        StoreError,
        match="nothing to roll back to .no ancestor served every client before: 1 candidate",
    ):
        rollback(store)
    assert _statuses(store) == {1: "candidate", 2: "promoted"}


def test_a_canary_needs_a_serving_version_to_roll_back_to(store: RunStore) -> None:
    add_version(store, _params(), 0, status="canary")
    with pytest.raises(StoreError, match="canary version 1: no version is promoted"):
        rollback(store)
    assert _statuses(store) == {1: "canary"}
    promote(store, 1)  # a canary may be promoted directly
    promote(store, 1)
    add_version(store, _params(), 1, parent_id=1, status="promoted")
    assert promote(store, 1).status == "promoted"  # a superseded version may serve again
    assert _statuses(store) == {1: "promoted", 2: "superseded"}


def test_status_changes_are_one_transaction(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_version(store, _params(), 0, status="promoted")
    add_version(store, _params(), 1, parent_id=1, status="promoted")
    calls: list[int] = []
    real = versions_module._set_status

    def fail_second(conn: sqlite3.Connection, version_id: int, status: str) -> None:
        calls.append(version_id)
        if len(calls) == 2:
            raise sqlite3.OperationalError("disk I/O error")
        real(conn, version_id, status)

    monkeypatch.setattr(versions_module, "_set_status", fail_second)
    with pytest.raises(StoreError, match="cannot roll back version 2: disk I/O error"):
        rollback(store, 2)
    assert calls == [2, 1] and _statuses(store) == {1: "superseded", 2: "promoted"}
    with pytest.raises(sqlite3.IntegrityError):  # the database keeps one serving version
        store._conn.execute("UPDATE model_versions SET status = 'promoted' WHERE version_id = 1")


def test_update_metrics_merges(store: RunStore) -> None:
    add_version(store, _params(), 0, metrics={"accuracy": 0.9, "loss": 0.3})
    merged = update_metrics(store, 1, {"canary_accuracy": 0.91, "loss": 0.25})
    assert merged.metrics == {"accuracy": 0.9, "loss": 0.25, "canary_accuracy": 0.91}
    assert get_version(store, 1) == merged
    with pytest.raises(StoreError, match="no model version 2"):
        update_metrics(store, 2, {"a": 1.0})


def test_the_file_is_in_place_before_its_row(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = _params(8, torch.float64)
    file = store.path / "versions" / "v1.safetensors"
    real = versions_module._insert

    def check_then_insert(conn: sqlite3.Connection, row: tuple[object, ...]) -> None:
        assert file.is_file() and file.read_bytes()  # complete and in place
        real(conn, row)

    monkeypatch.setattr(versions_module, "_insert", check_then_insert)
    add_version(store, params, 0)

    def crash(conn: sqlite3.Connection, row: tuple[object, ...]) -> None:
        raise RuntimeError("killed between the file and its row")

    monkeypatch.setattr(versions_module, "_insert", crash)
    with pytest.raises(RuntimeError):
        add_version(store, _params(3), 1, parent_id=1)
    assert [v.version_id for v in list_versions(store)] == [1]
    assert (store.path / "versions" / "v2.safetensors").is_file()  # a file without a row
    with pytest.raises(StoreError, match="no model version 2"):
        load_version_params(store, 2)
    assert not list((store.path / "versions").glob(".pending-*"))
    monkeypatch.setattr(versions_module, "_insert", real)
    assert add_version(store, _params(4, seed=5), 2).version_id == 2  # replaces the orphan
    assert torch.equal(load_version_params(store, 2), _params(4, seed=5))


def test_a_failed_write_leaves_nothing(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(path: Path, data: bytes) -> None:
        path.write_bytes(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(versions_module, "_write", full)
    with pytest.raises(StoreError, match="cannot write model version .* the disk is full"):
        add_version(store, _params(), 0)
    assert list_versions(store) == [] and list((store.path / "versions").iterdir()) == []


def test_stale_temporary_and_orphan_files_are_ignored(store: RunStore) -> None:
    folder = store.path / "versions"
    folder.mkdir()
    (folder / ".pending-0123456789ab.safetensors.tmp").write_bytes(b"half a model")
    (folder / "v1.safetensors").write_bytes(b"written, never committed")
    assert list_versions(store) == []
    add_version(store, _params(seed=3), 0)
    assert torch.equal(load_version_params(store, 1), _params(seed=3))


def test_a_killed_writer_leaves_no_row_without_its_file(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, torch
        from fedforge.config import Config
        from fedforge.store import RunStore
        from fedforge.store import versions
        store = RunStore.create({str(tmp_path)!r}, Config(name="killed"))
        versions.add_version(store, torch.ones(3), 0, status="promoted")
        print(store.path, flush=True)
        versions._insert = lambda conn, row: os._exit(9)
        versions.add_version(store, torch.zeros(3), 1, parent_id=1)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    with RunStore.open(Path(proc.stdout.strip())) as store:
        assert _statuses(store) == {1: "promoted"}
        assert torch.equal(load_version_params(store, 1), torch.ones(3))
        assert add_version(store, torch.full((2,), 7.0), 1).version_id == 2
        assert torch.equal(load_version_params(store, 2), torch.full((2,), 7.0))


def test_a_damaged_file_is_refused_by_name(store: RunStore) -> None:
    add_version(store, _params(), 0)
    add_version(store, _params(), 1)
    file = store.path / "versions" / "v1.safetensors"
    data = bytearray(file.read_bytes())
    data[-1] ^= 0x40  # one bit of one parameter
    file.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=f"'{file}' of model version 1 is damaged: .*sha256"):
        load_version_params(store, 1)
    file.write_bytes(bytes(data[:20]))
    with pytest.raises(StoreError, match=f"'{file}' of model version 1 is damaged"):
        load_version_params(store, 1)
    file.unlink()
    with pytest.raises(StoreError, match=f"'{file}' of model version 1 is missing"):
        load_version_params(store, 1)
    store._conn.execute("UPDATE model_versions SET params_shape = '[7]' WHERE version_id = 2")
    with pytest.raises(StoreError, match=r"holds float32 \[6\], its row says float32 \[7\]"):
        load_version_params(store, 2)


def _cli(runs: Path, *argv: str) -> int:
    return main(["models", *argv[:2], "--runs-dir", str(runs), *argv[2:]])


def test_models_list_promote_rollback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    with RunStore.create(runs, Config(name="canary")) as s:
        run = s.path.name
        add_version(s, _params(), 9, metrics={"accuracy": 0.9}, status="promoted")
        add_version(s, _params(), 19, parent_id=1, metrics={"accuracy": 0.91}, status="canary")
    assert _cli(runs, "list", run) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["VERSION", "PARENT", "ROUND", "STATUS", "CREATED", "METRICS"]
    assert out[1].split()[:5] == ["*", "1", "-", "10", "promoted"]
    assert out[1].endswith("accuracy=0.9") and out[2].split()[:4] == ["2", "1", "20", "canary"]
    assert out[3] == "* serving every client outside the canary"
    assert _cli(runs, "promote", run, "2") == 0
    assert capsys.readouterr().out == (
        "version 2 promoted: it serves every client; version 1 superseded\n"
    )
    assert _cli(runs, "rollback", "canary") == 0  # the run by its config name
    assert capsys.readouterr().out == "version 2 rolled back; version 1 serves every client\n"
    assert main(["models", "list", str(runs / run)]) == 0  # the run by its path
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:3]] == [["*", "1"], ["2", "1"]]


def test_models_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    with RunStore.create(runs, Config(name="refused")) as s:
        run = s.path.name
    assert _cli(runs, "list", run) == 0
    out = capsys.readouterr().out
    assert out.startswith("no model versions: ") and out.count("\n") == 1
    assert "deployment.canary_every" in out  # how to get them
    assert _cli(runs, "rollback", run) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedforge: error: nothing to roll back in run") and err.count("\n") == 1
    with RunStore.open(runs / run) as s:
        add_version(s, _params(), 0, status="promoted")
        add_version(s, _params(), 1, parent_id=1, status="canary")
        rollback(s, 2)
    assert _cli(runs, "promote", run, "2") == 2
    assert "promote version 2: its status is rolled_back" in capsys.readouterr().err
    assert _cli(runs, "promote", run, "5") == 2
    assert "no model version 5" in capsys.readouterr().err
    assert _cli(runs, "list", "nosuchrun") == 2
    assert "no run matches 'nosuchrun'" in capsys.readouterr().err
    assert os.listdir(runs) == [run]


def test_a_change_to_a_finished_run_says_no_client_hears_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    with RunStore.create(runs, Config(name="done")) as s:
        run = s.path.name
        add_version(s, _params(), 0, status="promoted")
        add_version(s, _params(), 1, parent_id=1, status="canary")
    assert _cli(runs, "rollback", run) == 0  # a running run: its server tells the clients
    assert capsys.readouterr().out == "version 2 rolled back; version 1 serves every client\n"
    with RunStore.open(runs / run) as s:
        add_version(s, _params(), 2, parent_id=1, status="canary")
        s.finish({})
    assert _cli(runs, "rollback", run) == 0
    out = capsys.readouterr().out
    assert out.startswith("version 3 rolled back; version 1 serves every client; ")
    assert "finished" in out and "none will hear of it" in out
    assert _cli(runs, "promote", run, "1") == 0  # already serving: nothing changed, nothing to hear
    assert "hear" not in capsys.readouterr().out

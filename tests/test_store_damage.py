"""Damaged or unwritable run stores: a garbled WAL is reported, never folded into
the database by a reader; final parameters carry a checksum; a full disk gives a
one-line error and leaves no half-made run."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import TINY_LOGREG, MakeData, wrap_engine

from fedforge.cli import main
from fedforge.config import from_dict
from fedforge.core.errors import StoreError
from fedforge.engines import SimulationEngine
from fedforge.server.loop import run
from fedforge.store import RunStore, list_runs

WAL_HEADER, FRAME_HEADER, PAGE = 32, 24, 4096


class CopyAt(SimulationEngine):
    """An engine wrapper that copies the run directory (its database and WAL, as
    the open writer left them) into each of ``into`` when round ``at`` starts."""

    name = "copy"

    def __init__(self, inner: Any, at: int, runs: Path, into: Sequence[Path]) -> None:
        self.inner, self.at, self.runs, self.into = inner, at, runs, into

    def run_cohort(self, tasks: Sequence[Any], payload: bytes) -> Iterator[Any]:
        if tasks and tasks[0].round_idx == self.at:
            (run_dir,) = self.runs.iterdir()
            for root in self.into:
                shutil.copytree(
                    run_dir, root / run_dir.name, ignore=shutil.ignore_patterns("*-shm", "lock")
                )
        yield from self.inner.run_cohort(tasks, payload)

    def run_phase(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.run_phase(*args, **kwargs)

    def close(self) -> None:
        from fedforge.engines import close_engine

        close_engine(self.inner)


@pytest.fixture
def wal_copies(
    make_data: MakeData, one_thread: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """Two runs directories, each holding a copy of a real 10-round run taken after
    its 6th round, with the rounds in the WAL its writer had open."""
    runs, good, bad = tmp_path / "runs", tmp_path / "good", tmp_path / "bad"
    wrap_engine(monkeypatch, lambda engine: CopyAt(engine, 6, runs, (good, bad)))
    cfg = from_dict({**TINY_LOGREG, "rounds": 10, "name": "walrun", "runs_dir": str(runs)})
    run(cfg, data=make_data([12, 9, 14, 10]))
    return good, bad


def _files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if not p.name.endswith("-shm")}


def test_a_reader_writes_nothing_and_reports_a_garbled_wal(
    wal_copies: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A garbled frame in the WAL made `runs` and `show` report 1 of 10 rounds
    instead of 6, and their close checkpointed the damage into the database."""
    good, bad = wal_copies
    (good_run,) = good.iterdir()
    (bad_run,) = bad.iterdir()
    wal = bad_run / "store.sqlite-wal"
    data = bytearray(wal.read_bytes())
    frames = (len(data) - WAL_HEADER) // (FRAME_HEADER + PAGE)
    assert frames > 6, "the rounds are in the WAL"
    at = WAL_HEADER + frames // 3 * (FRAME_HEADER + PAGE) + FRAME_HEADER + 100
    data[at : at + 64] = bytes(b ^ 0x5A for b in data[at : at + 64])
    wal.write_bytes(bytes(data))
    for root, run_dir in ((good, good_run), (bad, bad_run)):
        before = _files(run_dir)
        (info,) = list_runs(root)
        code = main(["show", run_dir.name, "--runs-dir", str(root)])
        out, err = capsys.readouterr()
        assert _files(run_dir) == before, "a reader changed the run's files"
        if root == good:
            assert (info.status, info.rounds_done, info.rounds_planned) == ("died", 6, 10)
            assert code == 0 and "rounds    6 of 10" in out
        else:
            assert info.status == "damaged"
            assert code == 2 and "damaged" in err and "store.sqlite-wal" in err, err
            assert len(err.strip().splitlines()) == 1
            with pytest.raises(StoreError, match="damaged"):
                RunStore.open(run_dir, read_only=True)


def test_a_round_the_stream_names_and_the_database_lost_is_damage(tmp_path: Path) -> None:
    """A round committed (its line is in metrics.jsonl) and missing from the
    database: lost, whatever lost it, and reported rather than a shorter run."""
    import sqlite3

    from fedforge.config import Config
    from fedforge.store import ClientRecord, RoundRecord

    with RunStore.create(tmp_path, Config(name="lost", rounds=5)) as store:
        for i in range(3):
            store.record_round(
                RoundRecord(i, 1, 0.5, 0.8, 0.2, 10, 20, 8, 0.1, 0.01),
                [ClientRecord(i, 0, 50, 0.5, 1.0, 10, 20)],
            )
        path = store.path
    with sqlite3.connect(path / "store.sqlite") as db:
        db.execute("DELETE FROM rounds WHERE round_idx = 1")
    (info,) = list_runs(tmp_path)
    assert info.status == "damaged"
    with pytest.raises(StoreError, match=r"rounds 2 are in metrics.jsonl but missing"):
        RunStore.open(path, read_only=True)


def test_final_parameters_are_verified_on_load(
    make_data: MakeData, one_thread: None, tmp_path: Path
) -> None:
    """64 garbled bytes of the final parameters loaded silently, 16 parameters
    changed; every loader now verifies and refuses them in one line."""
    import torch

    from fedforge.algorithms.fedbn import client_params
    from fedforge.store.final import FINAL_NAME, load_final

    cfg = from_dict({**TINY_LOGREG, "rounds": 2, "runs_dir": str(tmp_path / "runs")})
    result = run(cfg, data=make_data([12, 9, 14, 10]))
    assert result.run_dir is not None
    final = load_final(result.run_dir)
    assert torch.equal(final["params"], result.params) and len(final["names"]) == 2
    path = result.run_dir / FINAL_NAME
    data = bytearray(path.read_bytes())
    data[-200:-136] = bytes(b ^ 0x5A for b in data[-200:-136])
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"final parameters in '.*' are damaged: .*sha256"):
        load_final(result.run_dir)
    with pytest.raises(StoreError, match="damaged"):
        client_params(result.run_dir, 0)
    # a run from before the checksums: its torch.save file still loads
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    torch.save({"params": result.params, "names": ["w", "b"]}, legacy / "final_params.pt")
    assert torch.equal(load_final(legacy)["params"], result.params)
    with pytest.raises(StoreError, match="did not finish"):
        load_final(tmp_path)


def _limit_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's own 'database or disk is full' while a run's database is made."""
    import sqlite3

    from fedforge.store import directory

    real = directory.connect

    def full(db: Path, create: bool = False, read_only: bool = False) -> sqlite3.Connection:
        conn = real(db, create=create, read_only=read_only)
        if create:
            conn.execute("PRAGMA max_page_count = 1")
        return conn

    monkeypatch.setattr(directory, "connect", full)


def _no_space(*args: Any, **kwargs: Any) -> None:
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["config", "database", "start"])
def test_a_full_disk_at_the_start_leaves_no_half_made_run(
    make_data: MakeData,
    one_thread: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    """A run that failed at its start for lack of space left a half-made directory
    that `fedforge runs` listed as unreadable (or as a run that died), and said so
    in a traceback; now one line says the disk is full, and nothing is left."""
    from fedforge.server import loop
    from fedforge.store import directory

    runs = tmp_path / "runs"
    cfg = from_dict({**TINY_LOGREG, "name": "full", "runs_dir": str(runs)})
    if where == "config":
        monkeypatch.setattr(directory, "dump", _no_space)
        said = r"cannot create run directory '.*full.*': the disk is full"
    elif where == "database":
        _limit_pages(monkeypatch)
        said = r"cannot create run directory '.*full.*': .*database or disk is full"
    else:
        monkeypatch.setattr(loop, "write_partition", _no_space)
        said = r"cannot start run '.*full.*': the disk is full"
    with pytest.raises(StoreError, match=said) as caught:
        run(cfg, data=make_data([12, 9, 14, 10]))
    assert len(str(caught.value).splitlines()) == 1
    assert list_runs(runs) == []
    assert list(runs.iterdir()) == []
    assert main(["runs", "--runs-dir", str(runs)]) == 0
    assert capsys.readouterr().out.strip() == "no runs"

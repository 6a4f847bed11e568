"""Checkpoints, per-client state and exact resume.

The contract (DESIGN idea 5): a run killed at any point -- here by a real
SIGKILL, or stopped by SIGTERM -- and resumed from its last good checkpoint ends
with the same parameters and the same per-round metrics, bit for bit, as a run
that was never interrupted (same machine, same thread count: one thread here).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedforge.config import Config, from_dict, override
from fedforge.core.errors import ConfigError, FedforgeError, StoreError
from fedforge.data.federated import FederatedData, load_federated_data
from fedforge.engines import SimulationEngine
from fedforge.report.runs import format_run_summary
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run
from fedforge.server.state import RunLock, StopSignals
from fedforge.store import (
    Checkpoint,
    CheckpointError,
    MemmapStateStore,
    MemoryStateStore,
    RunStore,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    make_state_store,
    read_metrics,
    save_checkpoint,
)
from fedforge.store import checkpoint as checkpoint_module
from fedforge.store import segments as segments_module
from fedforge.store.client_state import load_rows, save_rows
from fedforge.store.final import FINAL_META, load_final

# A tiny real job: 3 clients of 100 MNIST examples a round, 2 steps each, float64.
TINY = {
    "name": "tiny",
    "model": "2nn",
    "num_clients": 600,
    "client_fraction": 0.005,
    "batch_size": 50,
    "rounds": 10,
    "checkpoint_every": 2,
    "target_accuracy": None,
    "dtype": "float64",
}


# ----------------------------------------------------------------------------- (d) state


# a small float64 federation many tests here run (4 clients of [7, 12, 5, 9])
SMALL: dict[str, Any] = {
    "model": "2nn", "num_clients": 4, "client_fraction": 0.5, "batch_size": 4,
    "rounds": 4, "target_accuracy": None, "dtype": "float64",
}  # fmt: skip


def test_memory_store_gather_scatter_and_init() -> None:
    init = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    store = MemoryStateStore(5, 3, torch.float64, init)
    assert torch.equal(store.gather([4, 0]), init.expand(2, 3))
    store.scatter([3, 1], torch.arange(6, dtype=torch.float64).reshape(2, 3))
    assert store.has(3) and store.has(1) and not store.has(0)
    assert store.written() == [1, 3]
    got = store.gather([1, 2, 3])
    assert torch.equal(got, torch.tensor([[3.0, 4, 5], [1, 2, 3], [0, 1, 2]], dtype=torch.float64))
    got[0] += 100  # gather returns a copy
    assert store.gather([1])[0, 0] == 3.0
    with pytest.raises(StoreError, match="out of range"):
        store.gather([5])
    with pytest.raises(StoreError, match="shape"):
        store.scatter([0], torch.zeros(1, 4, dtype=torch.float64))
    with pytest.raises(StoreError, match="repeat"):
        store.scatter([0, 0], torch.zeros(2, 3, dtype=torch.float64))


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_memmap_store_is_sparse_and_lazy(tmp_path: Path) -> None:
    n, p = 2000, 50_000  # 400 MB if it were allocated
    store = MemmapStateStore(n, p, tmp_path / "state", torch.float32)
    assert not store.path.exists()  # nothing until the first write
    assert torch.equal(store.gather([7]), torch.zeros(1, p))
    rss0 = _rss_bytes()
    rows = torch.randn(3, p, generator=torch.Generator().manual_seed(0))
    store.scatter([10, 1999, 500], rows)
    store.flush()
    st = os.stat(store.path)
    assert st.st_size == n * p * 4
    assert st.st_blocks * 512 < 20 * p * 4  # only the written rows have blocks
    assert _rss_bytes() - rss0 < 50 * 2**20
    assert torch.equal(
        store.gather([500, 10, 0]), torch.cat([rows[2:], rows[:1], torch.zeros(1, p)])
    )
    assert store.written() == [10, 500, 1999]
    store.close()


def test_reading_every_row_once_keeps_the_process_small(tmp_path: Path) -> None:
    """A checkpoint reads every written row: through a mapping they all stayed in
    the process's resident memory (2 GB after one checkpoint of a 2 GB table)."""
    n, p = 300, 250_000  # 300 MB written
    store = MemmapStateStore(n, p, tmp_path / "state", torch.float32)
    for c in range(n):
        store.scatter([c], torch.full((1, p), float(c)))
    rss0 = _rss_bytes()
    total = 0.0
    for c in range(n):
        total += float(store.gather([c])[0, -1])
    assert total == sum(range(n))
    assert _rss_bytes() - rss0 < 40 * 2**20  # a mapping: about 300 MB
    ids, _ = save_rows(store, tmp_path / "rows.bin")  # reads them all again, in chunks
    assert ids == list(range(n))


def test_a_closed_store_refuses_use_and_ids_are_checked_alike(tmp_path: Path) -> None:
    """close() left a store that read its rows as zeros (and a scatter recreated
    the file empty); has() wrapped -1 to the last client on one backend only."""
    mem = MemoryStateStore(4, 3)
    disk = MemmapStateStore(4, 3, tmp_path / "state", torch.float32)
    for store in (mem, disk):
        store.scatter([3], torch.ones(1, 3))
        assert store.has(3) and not store.has(0)
        for bad in (-1, 4):
            with pytest.raises(StoreError, match="out of range"):
                store.has(bad)
        with pytest.raises(StoreError, match="must be integers"):
            store.gather([1.7])  # type: ignore[list-item]
    disk.close()
    with pytest.raises(StoreError, match="was closed"):
        disk.gather([3])


@pytest.mark.parametrize("failure", ["enospc", "short"])
def test_a_full_disk_is_a_store_error_not_a_sigbus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """Rows are written with pwrite: a full disk raises (through the mapping it was
    a SIGBUS that killed the process, the run left 'running')."""
    import errno

    store = MemmapStateStore(10, 1000, tmp_path / "state", torch.float32)
    store.scatter([1], torch.ones(1, 1000))

    def full(fd: int, data: bytes, offset: int) -> int:
        if failure == "short":
            return len(data) // 2
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(StoreError, match=r"client 3's state .*(No space|disk full)"):
        store.scatter([3], torch.ones(1, 1000))
    assert store.written() == [1]  # the failed row is not taken as written


def test_working_tables_are_removed_with_their_store_and_their_process(tmp_path: Path) -> None:
    import gc
    import tempfile

    from fedforge.store.client_state import working_dir

    where = working_dir("test")
    store = make_state_store(10, 101, torch.float32, where, 4000, remove_dir=True)
    store.scatter([3], torch.ones(1, 101))
    assert where.is_dir() and where.name.startswith(f"fedforge-state-{os.getpid()}-test-")
    del store
    gc.collect()
    assert not where.exists()
    # a killed run's table (its process is gone) goes at the next table's creation
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    orphan = Path(tempfile.gettempdir()) / f"fedforge-state-{gone.stdout.strip()}-fedbn-abc123"
    orphan.mkdir()
    (orphan / "client_state.f32.memmap").write_bytes(b"x")
    live = Path(tempfile.gettempdir()) / f"fedforge-state-{os.getpid()}-fedbn-abc123"
    live.mkdir()
    try:
        working_dir("test")
        assert not orphan.exists() and live.is_dir()
    finally:
        shutil.rmtree(live, ignore_errors=True)
        shutil.rmtree(orphan, ignore_errors=True)


def test_make_state_store_picks_by_budget(tmp_path: Path) -> None:
    small = make_state_store(10, 100, torch.float32, tmp_path, memory_budget_bytes=4000)
    big = make_state_store(10, 101, torch.float32, tmp_path, memory_budget_bytes=4000)
    assert isinstance(small, MemoryStateStore) and isinstance(big, MemmapStateStore)
    with pytest.raises(StoreError, match="no directory"):
        make_state_store(10_000, 1_663_370, torch.float32, None)
    huge = make_state_store(10_000, 1_663_370, torch.float32, tmp_path / "h")  # 66 GB: memmap
    assert isinstance(huge, MemmapStateStore) and not huge.path.exists()


def test_rows_round_trip_across_backends(tmp_path: Path) -> None:
    src = MemoryStateStore(50, 7, torch.float64)
    vals = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    src.scatter([42, 3, 17], vals)
    ids, digest = save_rows(src, tmp_path / "rows.bin")
    assert ids == [3, 17, 42] and len(digest) == 64
    dst = MemmapStateStore(50, 7, tmp_path / "mm", torch.float64)
    dst.scatter([0], torch.ones(1, 7, dtype=torch.float64))  # cleared by the load
    load_rows(dst, tmp_path / "rows.bin", ids)
    assert dst.written() == [3, 17, 42]
    assert torch.equal(dst.gather([3, 17, 42]), src.gather([3, 17, 42]))


# ----------------------------------------------------------------------------- (a) checkpoints


def _ckpt(next_round: int) -> Checkpoint:
    gen = torch.Generator().manual_seed(next_round)
    return Checkpoint(
        next_round,
        torch.randn(11, dtype=torch.float64, generator=gen),
        {"velocity": torch.randn(11, dtype=torch.float64, generator=gen)},
        {"eval_accuracy": [0.1 + 0.2, 1 / 3], "total_bytes": 12345},
    )


def test_checkpoint_round_trip_and_keep_two(tmp_path: Path) -> None:
    state = MemoryStateStore(9, 4, torch.float32)
    state.scatter([8, 2], torch.arange(8, dtype=torch.float32).reshape(2, 4))
    for r in (2, 4, 6):
        path = save_checkpoint(tmp_path, _ckpt(r), state)
    assert path == tmp_path / "checkpoints" / "round-000006"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["round-000006", "round-000004"]
    restored = MemoryStateStore(9, 4, torch.float32)
    got = load_checkpoint(path, restored)
    want = _ckpt(6)
    assert got.next_round == 6 and torch.equal(got.params, want.params)
    assert torch.equal(got.optimizer_state["velocity"], want.optimizer_state["velocity"])
    assert got.loop == want.loop  # JSON floats round-trip exactly
    assert got.torch_rng_state is not None and torch.equal(
        got.torch_rng_state, torch.get_rng_state()
    )
    assert restored.written() == [2, 8] and torch.equal(
        restored.gather([2, 8]), state.gather([2, 8])
    )
    # a resumed run writing an earlier round drops the abandoned later ones
    save_checkpoint(tmp_path, _ckpt(4), state)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["round-000004"]
    assert not any(p.name.startswith(".") for p in (tmp_path / "checkpoints").iterdir())


def test_at_most_keep_checkpoints_are_on_disk_while_one_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full rewrite of a table holds every written row (66 GB at the issue's
    scale): the oldest went before the new one was written, two at the peak."""
    state = MemoryStateStore(9, 4, torch.float32)
    seen: list[list[str]] = []
    real = segments_module.save_rows

    def spy(store: Any, path: Path, ids: Any = None) -> Any:
        seen.append([p.name for p in list_checkpoints(tmp_path)])
        return real(store, path, ids)

    monkeypatch.setattr(segments_module, "save_rows", spy)
    for r in (2, 4, 6, 8):
        state.scatter([r], torch.ones(1, 4))  # a row changed: each writes a segment
        save_checkpoint(tmp_path, _ckpt(r), state)
    assert seen == [[], ["round-000002"], ["round-000004"], ["round-000006"]]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["round-000008", "round-000006"]


def test_a_checkpoint_that_cannot_be_written_does_not_end_the_run(
    make_data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A full disk at a periodic checkpoint: the run goes on (the older checkpoint
    is whole) and ends as an uninterrupted run does."""
    from fedforge.server import run_rounds
    from fedforge.store import CheckpointError as StoreCheckpointError

    data = make_data([7, 12, 5, 9], dtype=torch.float64)
    base = {**SMALL, "checkpoint_every": 1}
    want = run(from_dict({**base, "runs_dir": str(tmp_path / "a")}), data)
    real = run_rounds.save_checkpoint

    def full_at_round_2(run_dir: Path, ckpt: Any, tables: Any) -> Any:
        if ckpt.next_round == 2:
            raise StoreCheckpointError(f"cannot write checkpoint '{run_dir}': No space left")
        return real(run_dir, ckpt, tables)

    monkeypatch.setattr(run_rounds, "save_checkpoint", full_at_round_2)
    capsys.readouterr()
    got = run(from_dict({**base, "runs_dir": str(tmp_path / "b")}), data)
    said = capsys.readouterr()
    assert "No space left; a resume starts from the checkpoint before; the run goes on" in (
        said.out + said.err
    )
    assert torch.equal(got.params, want.params) and len(got.rounds) == 4


@pytest.mark.parametrize(
    "damage", ["flip", "truncate", "no-meta", "meta-ids", "meta-ids-unchecked", "meta-ids-repeat"]
)
def test_bad_latest_checkpoint_falls_back(tmp_path: Path, damage: str) -> None:
    """Any damage, including to the row ids that live only in meta.json (7 -> 6
    gave client 7's state to client 6, with every file's checksum intact)."""
    table = MemoryStateStore(9, 4, torch.float32)
    table.scatter([2, 7], torch.arange(8, dtype=torch.float32).reshape(2, 4))
    for r in (2, 4):
        save_checkpoint(tmp_path, _ckpt(r), table)
    latest = tmp_path / "checkpoints" / "round-000004"
    tensors = latest / "state.safetensors"
    if damage.startswith("meta-ids"):
        meta = json.loads((latest / "meta.json").read_text())
        segment = meta["client_state"]["residual"]["segments"][0]
        segment["ids"] = [2, 6] if damage != "meta-ids-repeat" else [2, 2]
        if damage != "meta-ids":  # the digest recomputed (or an older checkpoint): the ids
            meta["meta_sha256"] = checkpoint_module._meta_digest(meta)  # are checked too
            if damage == "meta-ids-unchecked":  # format 1 could have no digest
                segment["ids"] = [2, 9]  # past num_clients
                del meta["meta_sha256"]
                meta["format"] = 1
        (latest / "meta.json").write_text(json.dumps(meta))
    elif damage == "flip":
        data = bytearray(tensors.read_bytes())
        data[-5] ^= 0x01
        tensors.write_bytes(bytes(data))
    elif damage == "truncate":
        tensors.write_bytes(tensors.read_bytes()[:100])
    else:
        (latest / "meta.json").unlink()
    messages: list[str] = []
    restored = MemoryStateStore(9, 4, torch.float32)
    got = load_latest(tmp_path, restored, warn_fn=messages.append)
    assert got.next_round == 2 and torch.equal(got.params, _ckpt(2).params)
    assert restored.written() == [2, 7] and torch.equal(restored.gather([7]), table.gather([7]))
    assert len(messages) == 1 and "\n" not in messages[0]
    assert "round-000004" in messages[0] and "using round-000002" in messages[0]
    with pytest.raises(StoreError):
        load_checkpoint(latest, MemoryStateStore(9, 4, torch.float32))


def test_no_good_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        load_latest(tmp_path)
    save_checkpoint(tmp_path, _ckpt(2))
    (tmp_path / "checkpoints" / "round-000002" / "state.safetensors").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="no usable checkpoint.*round-000002") as info:
        load_latest(tmp_path)
    assert isinstance(info.value, FedforgeError)


def test_checkpoint_every_is_validated() -> None:
    assert Config().checkpoint_every == 10 and Config(checkpoint_every=0).checkpoint_every == 0
    with pytest.raises(ConfigError, match="'checkpoint_every' = -1"):
        from_dict({"checkpoint_every": -1})


def test_stop_signals_set_flag_and_restore_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs between bytecodes of the main thread
        assert stop.name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) == before


# ----------------------------------------------------------------------------- (b, c) resume

ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like the subprocesses (OMP_NUM_THREADS=1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(mnist_dir_module: Path) -> dict[str, Any]:
    return {**TINY, "data_dir": str(mnist_dir_module)}


@pytest.fixture(scope="module")
def mnist_dir_module() -> Path:
    root = os.environ.get("FEDFORGE_DATA")
    if not root or not Path(root).is_dir():
        pytest.skip("FEDFORGE_DATA is not set: no real MNIST")
    return Path(root)


@pytest.fixture(scope="module")
def tiny_data(tiny: dict[str, Any]) -> FederatedData:
    return load_federated_data(from_dict(tiny))


@pytest.fixture(scope="module")
def reference(
    tiny: dict[str, Any], tiny_data: FederatedData, one_thread: None, tmp_path_factory: Any
) -> Path:
    """The uninterrupted run, in this process, one thread."""
    runs = tmp_path_factory.mktemp("reference")
    result = run(from_dict({**tiny, "runs_dir": str(runs)}), data=tiny_data)
    assert result.run_dir is not None and result.stopped is None
    return result.run_dir


def _start(tiny: dict[str, Any], runs: Path) -> subprocess.Popen[str]:
    runs.mkdir(parents=True, exist_ok=True)
    cfg = runs.parent / f"{runs.name}.yaml"
    cfg.write_text(yaml.safe_dump({**tiny, "runs_dir": str(runs)}))
    return subprocess.Popen(
        [sys.executable, "-m", "fedforge.cli", "run", "-c", str(cfg), "-q"],
        env={**os.environ, **ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_rounds(proc: subprocess.Popen[str], runs: Path, count: int) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for stream in runs.glob("[!.]*/metrics.jsonl"):  # not a run still being made
            try:
                if len(stream.read_text().splitlines()) >= count:
                    return stream.parent
            except FileNotFoundError:  # renamed between the listing and the read
                continue
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    raise AssertionError(f"the run did not record {count} rounds in 60 s")


def _rows(run_dir: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every recorded number except wall-clock times."""
    with RunStore.open(run_dir) as store:
        rounds = [
            dataclasses.astuple(dataclasses.replace(r, seconds=0.0, created=None))
            for r in store.rounds()
        ]
        return rounds, [dataclasses.astuple(c) for c in store.client_rounds()]


def _assert_identical(run_dir: Path, reference: Path) -> None:
    got = load_final(run_dir)["params"]
    want = load_final(reference)["params"]
    assert got.dtype == torch.float64 and torch.equal(got, want)
    rounds, clients = _rows(run_dir)
    want_rounds, want_clients = _rows(reference)
    assert len(rounds) == TINY["rounds"]
    assert rounds == want_rounds  # test accuracy/loss, train loss, bytes, lr: exact
    assert clients == want_clients
    stream = read_metrics(run_dir / "metrics.jsonl")
    assert [m["round_idx"] for m in stream] == list(range(TINY["rounds"]))
    assert [m["test_accuracy"] for m in stream] == [r[3] for r in rounds]
    with RunStore.open(run_dir) as store, RunStore.open(reference) as ref:
        assert store.status == "finished"
        summary, want_summary = store.summary() or {}, ref.summary() or {}
    for key in ("rounds_done", "best_accuracy", "final_accuracy", "final_loss", "bytes_up"):
        assert summary[key] == want_summary[key], key


def test_sigkill_then_cli_resume_is_bit_identical(
    tiny: dict[str, Any], reference: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    proc = _start(tiny, runs)
    run_dir = _wait_for_rounds(proc, runs, 3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / FINAL_META).exists(), "the run finished before the kill"
    with RunStore.open(run_dir) as store:
        assert store.status == "running" and len(store.rounds()) >= 3
    assert list_checkpoints(run_dir)  # at least round-000002
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedforge.cli",
            "resume",
            run_dir.name,
            "--runs-dir",
            str(runs),
            "-q",
        ],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "rounds done      10" in done.stdout
    _assert_identical(run_dir, reference)


def test_sigterm_checkpoints_and_resume_finishes_identically(
    tiny: dict[str, Any], tiny_data: FederatedData, reference: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    proc = _start(tiny, runs)
    run_dir = _wait_for_rounds(proc, runs, 3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "fedforge resume" in err
    with RunStore.open(run_dir) as store:
        done = len(store.rounds())
        assert store.status == "failed" and "SIGTERM" in (store.summary() or {})["error"]
    assert 3 <= done < TINY["rounds"]
    newest = list_checkpoints(run_dir)[0]
    assert newest.name == f"round-{done:06d}"  # the round in flight finished, then a checkpoint
    assert json.loads((newest / "meta.json").read_text())["next_round"] == done
    assert not (run_dir / FINAL_META).exists()
    with RunStore.open(run_dir) as store:
        assert "resume with: fedforge resume" in format_run_summary(store)
        assert store.info().status == "stopped" and "[stopped]" in format_run_summary(store)
    holder = RunLock(run_dir).acquire()  # as if the killed writer were still alive
    try:
        with pytest.raises(StoreError, match="another process"):
            resume(run_dir, data=tiny_data)
    finally:
        holder.release()
    real_open = os.open

    def read_only(path: Any, flags: int, *rest: Any) -> int:
        if str(path).endswith("/lock"):  # a read-only archive, or another user's run
            raise OSError(30, "Read-only file system")
        return real_open(path, flags, *rest)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "open", read_only)
        with pytest.raises(StoreError, match=r"cannot be written here \(Read-only file system\)"):
            resume(run_dir, data=tiny_data)  # was an OSError traceback
    result = resume(run_dir, data=tiny_data)
    assert result.stopped is None and len(result.rounds) == TINY["rounds"]
    _assert_identical(run_dir, reference)
    with pytest.raises(CheckpointError, match="finished"):
        resume(run_dir, data=tiny_data)


def test_resume_metrics_stream_keeps_last_line_per_round(tmp_path: Path) -> None:
    stream = tmp_path / "metrics.jsonl"
    lines = [{"round_idx": 0, "v": 1}, {"round_idx": 1, "v": 2}, {"round_idx": 1, "v": 3}]
    stream.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"round_idx": 2, "v"')
    assert read_metrics(stream) == [{"round_idx": 0, "v": 1}, {"round_idx": 1, "v": 3}]


def test_a_forked_child_does_not_inherit_the_run_lock(tmp_path: Path) -> None:
    """A pool worker is a fork of the server: were the lock's open file shared with
    it, a worker outliving a killed server would keep the run locked forever."""
    from fedforge.server import state

    lock = RunLock(tmp_path).acquire()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (its fork hooks have run) idles, as a pool worker
        os.write(ready_w, b"1")
        time.sleep(30)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        fd = lock._fd  # the server dies: the kernel closes its file, unlocking nothing
        assert fd is not None
        state._HELD_LOCKS.discard(fd)
        os.close(fd)
        lock._fd = None
        RunLock(tmp_path).acquire().release()  # raises StoreError if the child held it
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)


def test_a_run_killed_before_its_first_checkpoint_resumes_from_the_start(
    make_data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 0's state is the seed's: a run that died before its first checkpoint
    (here in round 2 of 4, checkpoints every 10) is resumed from round 0, in its own
    directory, to the uninterrupted run's parameters and rounds."""

    data = make_data([7, 12, 5, 9], dtype=torch.float64)
    base = {**SMALL, "checkpoint_every": 10}
    want = run(from_dict({**base, "runs_dir": str(tmp_path / "a")}), data)

    run_dir = _crashed_run(monkeypatch, {**base, "runs_dir": str(tmp_path / "b")}, data, 2)
    assert list_checkpoints(run_dir) == []
    with RunStore.open(run_dir) as store:
        assert len(store.rounds()) == 2 and store.status == "failed"
    got = resume(run_dir, data=data)
    assert got.run_dir == run_dir and torch.equal(got.params, want.params)
    assert [r.test_loss for r in got.rounds] == [r.test_loss for r in want.rounds]
    with RunStore.open(run_dir) as store:
        assert len(store.rounds()) == 4 and store.status == "finished"


def test_resume_refuses_a_run_that_finished_while_it_was_building(
    make_data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status is read again once the lock is held: a resume started while the
    run was live, whose build outlasted the run, must not rewind the finished run."""
    from fedforge.server import loop
    from fedforge.store import CheckpointError

    data = make_data([7, 12, 5, 9], dtype=torch.float64)
    base = {**SMALL, "rounds": 2, "runs_dir": str(tmp_path)}
    done = run(from_dict(base), data)
    assert done.run_dir is not None
    with RunStore.open(done.run_dir) as store:
        summary = store.summary()
        store.finish({}, status="running")  # as if still live when resume looked
    real_build = loop.build

    def slow_build(cfg: Any, data: Any = None, task: Any = None) -> Any:
        with RunStore.open(done.run_dir) as other:  # meanwhile, the live run ends
            other.finish(summary or {})
        return real_build(cfg, data, task)

    monkeypatch.setattr(loop, "build", slow_build)
    with pytest.raises(CheckpointError, match="is finished"):
        resume(done.run_dir, data=data)
    with RunStore.open(done.run_dir) as store:
        assert store.status == "finished" and len(store.rounds()) == 2


def test_a_run_whose_every_checkpoint_is_damaged_starts_again_from_round_0(
    make_data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """As a run killed before its first checkpoint does (it could not be resumed
    at all: 'no usable checkpoint'); the result is the uninterrupted run's."""

    data = make_data([7, 12, 5, 9], dtype=torch.float64)
    base = {
        **SMALL,
        "checkpoint_every": 2,
        "communication": {"uplink": "topk", "fraction": 0.1, "error_feedback": True},
    }
    want = run(from_dict({**base, "runs_dir": str(tmp_path / "a")}), data)

    run_dir = _crashed_run(monkeypatch, {**base, "runs_dir": str(tmp_path / "b")}, data, 3)
    (only,) = list_checkpoints(run_dir)
    (only / "state.safetensors").write_bytes(b"junk")
    capsys.readouterr()
    got = resume(run_dir, data=data)
    assert "starting again from round 1" in capsys.readouterr().err
    assert torch.equal(got.params, want.params)
    assert [r.test_loss for r in got.rounds] == [r.test_loss for r in want.rounds]


def _crash_in_round(round_idx: int) -> Any:
    """An engine wrapper that dies (as if killed) when round ``round_idx`` starts."""

    class Crash(SimulationEngine):
        name = "crash"

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def run_cohort(self, tasks: Any, payload: bytes) -> Any:
            if tasks[0].round_idx == round_idx:
                raise MemoryError("killed (test)")
            return self.inner.run_cohort(tasks, payload)

    return Crash


def _crashed_run(
    monkeypatch: pytest.MonkeyPatch, cfg: dict[str, Any], data: Any, round_idx: int
) -> Path:
    """The directory of ``cfg``'s run (alone in its runs_dir), killed as round
    ``round_idx`` starts."""
    from tests.conftest import wrap_engine

    with monkeypatch.context() as patch:
        wrap_engine(patch, _crash_in_round(round_idx))
        with pytest.raises(MemoryError):
            run(from_dict(cfg), data)
    (run_dir,) = Path(cfg["runs_dir"]).iterdir()
    return run_dir


def test_resume_with_other_data_or_model_is_refused_and_loses_nothing(
    make_data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other data (or another model) made every checkpoint look damaged: the run
    started again from round 0 on that data, over the old one. It is refused."""

    from fedforge.store import RunStore

    data = make_data([7, 12, 5, 9], dtype=torch.float64)
    base = {**SMALL, "checkpoint_every": 1, "algorithm": "scaffold", "runs_dir": str(tmp_path)}
    run_dir = _crashed_run(monkeypatch, base, data, 3)
    before = sorted(p.name for p in list_checkpoints(run_dir))
    other = make_data([7, 12, 5, 9], dtype=torch.float64, seed=5)
    with pytest.raises(StoreError, match="trained on other data"):
        resume(run_dir, data=other)
    with RunStore.open(run_dir) as store:
        assert len(store.rounds()) == 3 and store.status == "failed"  # the crash
    assert sorted(p.name for p in list_checkpoints(run_dir)) == before
    monkeypatch.setattr(
        "fedforge.server.loop.build",
        lambda c, d=None, t=None: build(override(c, {"model": "logreg"}), d, t),
    )
    with pytest.raises(StoreError, match="model of 199210 parameters; this build has 7850"):
        resume(run_dir, data=data)
    monkeypatch.undo()
    got = resume(run_dir, data=data)  # the right data: it goes on
    assert len(got.rounds) == 4


def test_a_run_from_before_build_json_resumes_unless_its_data_changed_since(
    make_data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older store has no build.json: it resumes (and gets one), except a
    Synthetic-IID run with beta != 0, whose data this version draws otherwise."""

    from fedforge.store.build_record import BUILD_NAME

    def crashed(cfg: dict[str, Any], data: Any) -> Path:
        run_dir = _crashed_run(monkeypatch, cfg, data, 2)
        (run_dir / BUILD_NAME).unlink()  # as a store written before it existed
        return run_dir

    base = {"num_clients": 4, "client_fraction": 0.5, "batch_size": 4, "rounds": 3,
            "target_accuracy": None, "dtype": "float64", "checkpoint_every": 1}  # fmt: skip
    data = make_data([7, 12, 5, 9], dtype=torch.float64)
    old = crashed({**base, "model": "2nn", "runs_dir": str(tmp_path / "a")}, data)
    assert len(resume(old, data=data).rounds) == 3
    assert (old / BUILD_NAME).is_file()
    synthetic = {**base, "dataset": "synthetic", "model": "logreg", "synthetic": {"iid": True}}
    iid = crashed({**synthetic, "runs_dir": str(tmp_path / "b")}, None)
    with pytest.raises(StoreError, match="Synthetic-IID data was drawn before"):
        resume(iid)


def test_a_full_disk_at_the_end_fails_the_run_resumably(
    make_data: Any, one_thread: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final parameters cannot be written (a full disk): a StoreError naming
    the file, no half-written file left, the run marked failed with the resume
    hint; once there is room, resume finishes it as if nothing happened."""
    from tests.conftest import TINY_LOGREG

    from fedforge.store import final as final_module
    from fedforge.store import list_runs

    data = make_data([12, 9, 14, 10])
    cfg = from_dict({**TINY_LOGREG, "rounds": 2, "runs_dir": str(tmp_path / "runs")})
    reference = run(override(cfg, {"runs_dir": str(tmp_path / "ref")}), data=data)
    real_write = final_module._write

    def full(path: Path, blob: bytes) -> None:
        if path.name.startswith("final_params"):
            path.write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, blob)

    monkeypatch.setattr(final_module, "_write", full)
    with pytest.raises(StoreError, match="cannot write final_params.safetensors in .*disk is full"):
        run(cfg, data=data)
    monkeypatch.setattr(final_module, "_write", real_write)
    (info,) = list_runs(tmp_path / "runs")
    assert not list(info.path.glob("final_params*"))
    with RunStore.open(info.path) as store:
        assert store.status == "failed"
        assert (store.summary() or {})["error"].endswith(f"fedforge resume {info.path}")
    done = resume(info.path, data=data)
    assert torch.equal(done.params, reference.params)


def test_the_layout_digest_names_frozen_layers_and_keeps_older_runs() -> None:
    """A layer frozen (or unfrozen) since the start changes what training does,
    so the build record's layout shows it; a model without frozen layers keeps
    the digest runs recorded before the flag existed."""
    import hashlib

    from fedforge.core.params import ParamSpec
    from fedforge.models.mnist import MnistMLP
    from fedforge.store.build_record import model_layout

    model = MnistMLP()
    spec = ParamSpec.of(model, include_buffers=True)
    old = ";".join(f"{e.name}:{e.shape}:{e.kind}" for e in spec.entries)
    assert model_layout(spec) == hashlib.blake2b(old.encode(), digest_size=8).hexdigest()
    model.fc1.requires_grad_(False)
    assert model_layout(ParamSpec.of(model, include_buffers=True)) != model_layout(spec)

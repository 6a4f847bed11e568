"""Incremental checkpoints of per-client tables (store/segments.py): each
checkpoint writes the rows changed since the previous one and links the rest."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from fedforge.store import (
    Checkpoint,
    CheckpointError,
    MemmapStateStore,
    MemoryStateStore,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)
from fedforge.store import checkpoint as checkpoint_module
from fedforge.store import segments as segments_module

ROW_BYTES = 4 * 4  # 4 float32 numbers a row


def _ckpt(next_round: int) -> Checkpoint:
    return Checkpoint(next_round, torch.full((3,), float(next_round), dtype=torch.float64))


def _rows(*pairs: tuple[int, float]) -> tuple[list[int], torch.Tensor]:
    ids = [c for c, _ in pairs]
    return ids, torch.tensor([[v] * 4 for _, v in pairs], dtype=torch.float32)


def _chain(path: Path, name: str = "residual") -> list[dict[str, object]]:
    meta = json.loads((path / "meta.json").read_text())
    return list(meta["client_state"][name]["segments"])


def _restored(path: Path) -> MemoryStateStore:
    table = MemoryStateStore(9, 4, torch.float32)
    load_checkpoint(path, table)
    return table


def _snapshot(table: MemoryStateStore) -> dict[int, list[float]]:
    return {c: table.gather([c])[0].tolist() for c in table.written()}


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_each_checkpoint_writes_only_the_rows_changed_since_the_last(
    tmp_path: Path, backend: str
) -> None:
    table = (
        MemoryStateStore(9, 4, torch.float32)
        if backend == "memory"
        else MemmapStateStore(9, 4, tmp_path / "work", torch.float32)
    )
    table.scatter(*_rows((1, 1.0), (5, 5.0), (7, 7.0)))
    first = save_checkpoint(tmp_path, _ckpt(2), table)
    table.scatter(*_rows((5, 50.0), (8, 8.0)))  # one rewritten, one new
    second = save_checkpoint(tmp_path, _ckpt(4), table)
    want_second = {1: [1.0] * 4, 5: [50.0] * 4, 7: [7.0] * 4, 8: [8.0] * 4}
    table.scatter(*_rows((1, 10.0)))
    third = save_checkpoint(tmp_path, _ckpt(6), table)

    chain = _chain(third)
    assert [(s["file"], s["ids"]) for s in chain] == [
        ("client_state.r000002.bin", [1, 5, 7]),
        ("client_state.r000004.bin", [5, 8]),
        ("client_state.r000006.bin", [1]),
    ]
    assert (third / "client_state.r000006.bin").stat().st_size == ROW_BYTES  # one row
    assert (third / "client_state.r000004.bin").stat().st_size == 2 * ROW_BYTES
    # the older segments are the previous checkpoint's files, not copies
    for name in ("client_state.r000002.bin", "client_state.r000004.bin"):
        assert os.stat(third / name).st_ino == os.stat(second / name).st_ino
    assert not first.exists()  # keep = 2
    # newest value wins; the older checkpoint still holds its own state
    assert _snapshot(_restored(third)) == {**want_second, 1: [10.0] * 4}
    assert _snapshot(_restored(second)) == want_second


def test_a_loaded_checkpoint_is_built_on_by_the_next(tmp_path: Path) -> None:
    """After a resume the next checkpoint links the chain it was loaded from."""
    table = MemoryStateStore(9, 4, torch.float32)
    table.scatter(*_rows((2, 2.0), (3, 3.0)))
    save_checkpoint(tmp_path, _ckpt(2), table)
    table.scatter(*_rows((3, 30.0)))
    loaded_from = save_checkpoint(tmp_path, _ckpt(4), table)

    resumed = MemoryStateStore(9, 4, torch.float32)  # a new process's table
    assert load_latest(tmp_path, resumed).next_round == 4
    assert resumed.changed() == []
    resumed.scatter(*_rows((6, 6.0)))
    newest = save_checkpoint(tmp_path, _ckpt(6), resumed)
    assert [s["ids"] for s in _chain(newest)] == [[2, 3], [3], [6]]
    assert os.stat(newest / "client_state.r000004.bin").st_ino == (
        os.stat(loaded_from / "client_state.r000004.bin").st_ino
    )
    assert _snapshot(_restored(newest)) == {2: [2.0] * 4, 3: [30.0] * 4, 6: [6.0] * 4}


def test_dead_rows_and_long_chains_are_rewritten_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By hand, one live row rewritten at every checkpoint: the chain holds 1, then
    2 copies (= 2 x live: kept), then 3 (> 2 x live): one full segment again."""
    table = MemoryStateStore(9, 4, torch.float32)
    lengths = []
    for r in (2, 4, 6, 8):
        table.scatter(*_rows((4, float(r))))
        lengths.append(len(_chain(save_checkpoint(tmp_path, _ckpt(r), table))))
    assert lengths == [1, 2, 1, 2]
    # at most MAX_SEGMENTS files: new rows every time (no dead ones), 3 allowed
    monkeypatch.setattr(segments_module, "MAX_SEGMENTS", 3)
    table = MemoryStateStore(9, 4, torch.float32)
    lengths = []
    for i, r in enumerate((2, 4, 6, 8, 10)):
        table.scatter(*_rows((i, float(r))))
        newest = save_checkpoint(tmp_path / "b", _ckpt(r), table)
        lengths.append(len(_chain(newest)))
    assert lengths == [1, 2, 3, 1, 2]
    assert _chain(newest)[0]["ids"] == [0, 1, 2, 3]  # the full rewrite: every row
    assert _snapshot(_restored(newest)) == {
        i: [float(r)] * 4 for i, r in enumerate(range(2, 12, 2))
    }


def _table(backend: str, where: Path) -> MemoryStateStore | MemmapStateStore:
    if backend == "memory":
        return MemoryStateStore(9, 4, torch.float32)
    return MemmapStateStore(9, 4, where / "work", torch.float32)


@pytest.mark.parametrize("fault", ["fsync", "rename"])
@pytest.mark.parametrize("backend", ["memory", "file"])
def test_a_cleared_table_or_a_failed_checkpoint_is_never_built_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, fault: str
) -> None:
    table = _table(backend, tmp_path)
    table.scatter(*_rows((1, 1.0)))
    save_checkpoint(tmp_path, _ckpt(2), table)
    table.clear()  # a rewind: the old rows are no longer the table's
    table.scatter(*_rows((2, 2.0)))
    cleared = save_checkpoint(tmp_path, _ckpt(4), table)
    assert [s["ids"] for s in _chain(cleared)] == [[2]]
    assert _snapshot(_restored(cleared)) == {2: [2.0] * 4}

    # a checkpoint that fails after its segment was written leaves the changes
    # pending: the next one writes them again
    table.scatter(*_rows((3, 3.0)))

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        if fault == "fsync":  # the temporary directory written, not yet in place
            m.setattr(checkpoint_module, "_fsync_dir", full_disk)
        else:
            m.setattr(Path, "rename", full_disk)
        with pytest.raises(CheckpointError, match="No space left"):
            save_checkpoint(tmp_path, _ckpt(6), table)
    table.scatter(*_rows((4, 4.0)))
    newest = save_checkpoint(tmp_path, _ckpt(8), table)
    assert [s["ids"] for s in _chain(newest)] == [[2], [3, 4]]
    assert _snapshot(_restored(newest)) == {2: [2.0] * 4, 3: [3.0] * 4, 4: [4.0] * 4}


def test_damage_to_a_segment_is_caught_in_every_checkpoint_that_links_it(
    tmp_path: Path,
) -> None:
    """The cost of sharing: the newest's own segment damaged, the previous is used;
    a shared one damaged, neither is usable (and the run starts over)."""
    table = MemoryStateStore(9, 4, torch.float32)
    table.scatter(*_rows((1, 1.0)))
    save_checkpoint(tmp_path, _ckpt(2), table)
    table.scatter(*_rows((2, 2.0)))
    newest = save_checkpoint(tmp_path, _ckpt(4), table)
    own = newest / "client_state.r000004.bin"
    own.write_bytes(own.read_bytes()[:-1] + b"\x01")
    messages: list[str] = []
    got = load_latest(tmp_path, MemoryStateStore(9, 4, torch.float32), messages.append)
    assert got.next_round == 2 and "client_state.r000004.bin fails its sha256" in messages[0]
    shared = newest / "client_state.r000002.bin"
    shared.write_bytes(b"")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        load_latest(tmp_path, MemoryStateStore(9, 4, torch.float32))


def test_a_format_1_checkpoint_still_loads(tmp_path: Path) -> None:
    """Before incremental checkpoints, one ``client_state.bin`` of every row with
    its ids in meta.json (rewritten here by hand from a one-segment checkpoint)."""
    table = MemoryStateStore(9, 4, torch.float32)
    table.scatter(*_rows((3, 3.0), (8, 8.0)))
    path = save_checkpoint(tmp_path, _ckpt(2), table)
    meta = json.loads((path / "meta.json").read_text())
    entry = meta["client_state"]["residual"]
    (segment,) = entry.pop("segments")
    entry["ids"] = segment["ids"]
    meta["format"] = 1
    meta["files"]["client_state.bin"] = meta["files"].pop(segment["file"])
    (path / segment["file"]).rename(path / "client_state.bin")
    meta["meta_sha256"] = checkpoint_module._meta_digest(meta)
    (path / "meta.json").write_text(json.dumps(meta))
    restored = _restored(path)
    assert _snapshot(restored) == {3: [3.0] * 4, 8: [8.0] * 4}
    restored.scatter(*_rows((4, 4.0)))  # and the next checkpoint builds on it
    newest = save_checkpoint(tmp_path, _ckpt(4), restored)
    assert [(s["file"], s["ids"]) for s in _chain(newest)] == [
        ("client_state.bin", [3, 8]),
        ("client_state.r000004.bin", [4]),
    ]
    assert _snapshot(_restored(newest)) == {3: [3.0] * 4, 4: [4.0] * 4, 8: [8.0] * 4}


def test_a_segment_name_in_meta_cannot_leave_the_checkpoint(tmp_path: Path) -> None:
    table = MemoryStateStore(9, 4, torch.float32)
    table.scatter(*_rows((3, 3.0)))
    path = save_checkpoint(tmp_path, _ckpt(2), table)
    meta = json.loads((path / "meta.json").read_text())
    meta["client_state"]["residual"]["segments"][0]["file"] = "../../elsewhere.bin"
    meta["meta_sha256"] = checkpoint_module._meta_digest(meta)
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="names a segment file '../../elsewhere.bin'"):
        load_checkpoint(path, MemoryStateStore(9, 4, torch.float32))


def test_the_same_round_checkpointed_again_holds_the_right_rows(tmp_path: Path) -> None:
    """A resumed run writes a round it has a checkpoint of: the new segment would
    take the name of that checkpoint's own, so the table is written in full."""
    table = MemoryStateStore(9, 4, torch.float32)
    table.scatter(*_rows((1, 1.0), (2, 2.0)))
    save_checkpoint(tmp_path, _ckpt(2), table)
    table.scatter(*_rows((3, 3.0)))
    save_checkpoint(tmp_path, _ckpt(4), table)
    table.scatter(*_rows((5, 5.0)))
    again = save_checkpoint(tmp_path, _ckpt(4), table)
    assert [s["ids"] for s in _chain(again)] == [[1, 2, 3, 5]]
    assert _snapshot(_restored(again)) == {1: [1.0] * 4, 2: [2.0] * 4, 3: [3.0] * 4, 5: [5.0] * 4}


@pytest.mark.parametrize("damage", ["flip", "truncate", "replace"])
def test_a_previous_segment_changed_on_disk_is_not_linked(tmp_path: Path, damage: str) -> None:
    """The next checkpoint writes the table in full instead of linking a file that
    is not as it was saved (a flipped byte, same size: its modification time;
    a truncation: its size; a copy put in its place: its inode)."""
    table = MemoryStateStore(9, 4, torch.float32)
    table.scatter(*_rows((1, 1.0), (2, 2.0)))
    first = save_checkpoint(tmp_path, _ckpt(2), table)
    segment = first / "client_state.r000002.bin"
    data = bytearray(segment.read_bytes())
    if damage == "flip":
        data[3] ^= 0x01
        time.sleep(0.01)  # a later modification time than the save's
        segment.write_bytes(bytes(data))
    elif damage == "truncate":
        segment.write_bytes(bytes(data[:-4]))
    else:
        copy = first / "copy"
        copy.write_bytes(bytes(data))
        copy.replace(segment)
    table.scatter(*_rows((3, 3.0)))
    newest = save_checkpoint(tmp_path, _ckpt(4), table)
    assert [s["ids"] for s in _chain(newest)] == [[1, 2, 3]]
    assert _snapshot(_restored(newest)) == {1: [1.0] * 4, 2: [2.0] * 4, 3: [3.0] * 4}


def test_a_link_that_fails_part_way_leaves_no_stray_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = MemoryStateStore(9, 4, torch.float32)
    for r in (2, 4):
        table.scatter(*_rows((r, float(r))))
        save_checkpoint(tmp_path, _ckpt(r), table)
    real = os.link
    calls: list[object] = []

    def second_fails(src: object, dst: object) -> None:
        calls.append(src)
        if len(calls) == 2:
            raise OSError(31, "Too many links")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(segments_module.os, "link", second_fails)
    table.scatter(*_rows((6, 6.0)))
    newest = save_checkpoint(tmp_path, _ckpt(6), table)
    assert len(calls) == 2
    assert [s["ids"] for s in _chain(newest)] == [[2, 4, 6]]  # written in full
    listed = {s["file"] for s in _chain(newest)} | {"meta.json", "state.safetensors"}
    assert {p.name for p in newest.iterdir()} == listed


def test_an_unchanged_table_is_still_rewritten_every_max_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No rows change, so the chain never grows; its oldest file is still shared
    by at most MAX_SEGMENTS checkpoints in a row."""
    monkeypatch.setattr(segments_module, "MAX_SEGMENTS", 3)
    table = MemoryStateStore(9, 4, torch.float32)
    table.scatter(*_rows((1, 1.0)))
    files = [_chain(save_checkpoint(tmp_path, _ckpt(r), table))[0]["file"] for r in range(1, 8)]
    assert files == [f"client_state.r{r:06d}.bin" for r in (1, 1, 1, 4, 4, 4, 7)]


def test_a_fallback_resume_keeps_the_checkpoint_it_resumed_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 4's checkpoint damaged, the run resumed from round 2's and reached
    round 4 again: writing it must not delete round 2's first (the only good one
    if this write fails; its segments are what the new one links)."""
    table = MemoryStateStore(9, 4, torch.float32)
    table.scatter(*_rows((1, 1.0)))
    save_checkpoint(tmp_path, _ckpt(2), table)
    table.scatter(*_rows((2, 2.0)))
    damaged = save_checkpoint(tmp_path, _ckpt(4), table)
    (damaged / "state.safetensors").write_bytes(b"junk")
    resumed = MemoryStateStore(9, 4, torch.float32)
    assert load_latest(tmp_path, resumed, lambda _: None).next_round == 2
    resumed.scatter(*_rows((2, 2.0)))  # rounds 2 and 3 again

    def full_disk(path: Path) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(checkpoint_module, "_fsync_dir", full_disk)
        with pytest.raises(CheckpointError):
            save_checkpoint(tmp_path, _ckpt(4), resumed)
    after = MemoryStateStore(9, 4, torch.float32)
    assert load_latest(tmp_path, after, lambda _: None).next_round == 2
    assert _snapshot(after) == {1: [1.0] * 4}
    newest = save_checkpoint(tmp_path, _ckpt(4), resumed)  # the disk freed: it links
    assert [s["ids"] for s in _chain(newest)] == [[1], [2]]
    assert _snapshot(_restored(newest)) == {1: [1.0] * 4, 2: [2.0] * 4}

"""Checkpoints: everything the round loop needs to continue a run exactly.

``<run_dir>/checkpoints/round-000010/`` is the state before round 10 runs:

- ``state.safetensors``: global ``params``, ``optimizer/<name>`` for each server
  optimizer state tensor, ``torch_rng_state``;
- ``client_state.bin`` (when the run keeps per-client state): the written rows,
  packed (see :func:`fedforge.store.client_state.save_rows`);
- ``meta.json``: format, ``next_round``, the loop's plain state (evaluation
  history, byte totals, rejected updates, wall time) and the sha256 and size of
  each file above. Written last: a checkpoint without it does not exist.

A checkpoint is written into a temporary directory, every file fsynced, then
renamed into place (and the parent directory fsynced), so a kill at any point
leaves either the old set or the new one. The newest ``keep`` (2) are kept.
Loading verifies sizes and checksums; an unusable newest checkpoint is reported
in one line and the one before it is used.

Randomness is derived from (seed, round, client, purpose) (``fedforge.rng``), so
there is no RNG stream to save; ``torch.get_rng_state()`` is saved and restored
anyway, though nothing in fedforge reads the global generator.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fedforge.errors import StoreError
from fedforge.store.client_state import ClientStateStore, load_rows, rows_sha256, save_rows

FORMAT = 1
KEEP = 2
CHECKPOINTS_DIR = "checkpoints"
TENSORS_NAME, CLIENT_STATE_NAME, META_NAME = "state.safetensors", "client_state.bin", "meta.json"
_NAME = re.compile(r"^round-(\d{6,})$")
_OPTIMIZER = "optimizer/"


class CheckpointError(StoreError):
    """No usable checkpoint: missing, corrupt, or not matching the run."""


@dataclass
class Checkpoint:
    """The loop's state before round ``next_round``. ``loop`` is plain JSON data."""

    next_round: int
    params: torch.Tensor
    optimizer_state: dict[str, torch.Tensor] = field(default_factory=dict)
    loop: dict[str, Any] = field(default_factory=dict)
    torch_rng_state: torch.Tensor | None = None
    path: Path | None = None  # where it was loaded from or written to


def checkpoint_name(next_round: int) -> str:
    return f"round-{next_round:06d}"


def list_checkpoints(run_dir: Path | str) -> list[Path]:
    """The run's checkpoint directories, newest (highest round) first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    run_dir: Path | str,
    ckpt: Checkpoint,
    client_state: ClientStateStore | None = None,
    keep: int = KEEP,
) -> Path:
    """Write ``ckpt`` (and the client state rows) atomically; keep the newest ``keep``."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    final = root / checkpoint_name(ckpt.next_round)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    tensors = {"params": ckpt.params.detach().contiguous().clone()}
    for name, value in ckpt.optimizer_state.items():
        tensors[_OPTIMIZER + name] = value.detach().contiguous().clone()
    rng = ckpt.torch_rng_state if ckpt.torch_rng_state is not None else torch.get_rng_state()
    tensors["torch_rng_state"] = rng.clone()
    blob = st_save(tensors)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "next_round": ckpt.next_round,
        "created": time.time(),
        "loop": ckpt.loop,
        "files": {TENSORS_NAME: {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}},
        "client_state": None,
    }
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        _write(tmp / TENSORS_NAME, blob)
        if client_state is not None:
            ids, digest = save_rows(client_state, tmp / CLIENT_STATE_NAME)
            size = (tmp / CLIENT_STATE_NAME).stat().st_size
            meta["files"][CLIENT_STATE_NAME] = {"bytes": size, "sha256": digest}
            meta["client_state"] = {
                "ids": ids,
                "num_clients": client_state.num_clients,
                "size": client_state.size,
                "dtype": str(client_state.dtype).removeprefix("torch."),
            }
        _write(tmp / META_NAME, json.dumps(meta).encode())
        _fsync_dir(tmp)
        old = root / f".old-{final.name}-{os.getpid()}"
        if final.exists():  # a resumed run writes the same round again
            final.rename(old)
        tmp.rename(final)
        _fsync_dir(root)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write checkpoint '{final}': {exc}") from None
    _prune(root, ckpt.next_round, keep)
    ckpt.path = final
    return final


def _prune(root: Path, newest: int, keep: int) -> None:
    """Drop leftovers of interrupted writes, checkpoints past ``newest`` (an abandoned
    future after a resume) and all but the newest ``keep``."""
    for p in root.iterdir():
        if p.name.startswith((".tmp-", ".old-")):
            shutil.rmtree(p, ignore_errors=True)
    kept = 0
    for p in list_checkpoints(root.parent):
        m = _NAME.match(p.name)
        if m is None or int(m.group(1)) > newest or kept >= keep:
            shutil.rmtree(p, ignore_errors=True)
        else:
            kept += 1


def _verified(path: Path, entry: Any) -> bytes | None:
    """Checks size and sha256 of a file against its meta entry; returns its bytes
    when small enough to hold (the tensors), else None after streaming the hash."""
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path.name}: no size and checksum in {META_NAME}")
    if not path.is_file():
        raise CheckpointError(f"{path.name} is missing")
    size = path.stat().st_size
    if size != entry.get("bytes"):
        raise CheckpointError(f"{path.name} has {size} bytes; expected {entry.get('bytes')}")
    if path.name == TENSORS_NAME:
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
    else:
        data, digest = None, rows_sha256(path)
    if digest != entry.get("sha256"):
        raise CheckpointError(f"{path.name} fails its sha256 check")
    return data


def load_checkpoint(path: Path | str, client_state: ClientStateStore | None = None) -> Checkpoint:
    """Read and verify one checkpoint directory; restore its rows into ``client_state``."""
    path = Path(path)
    try:
        meta = json.loads((path / META_NAME).read_text())
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CheckpointError(f"{META_NAME} is not a format-{FORMAT} checkpoint")
        files = meta.get("files") or {}
        blob = _verified(path / TENSORS_NAME, files.get(TENSORS_NAME))
        tensors = st_load(blob or b"")
        info = meta.get("client_state")
        if info is not None:
            _verified(path / CLIENT_STATE_NAME, files.get(CLIENT_STATE_NAME))
        next_round = int(meta["next_round"])
    except FileNotFoundError:
        raise CheckpointError(f"{META_NAME} is missing") from None
    except (ValueError, KeyError, TypeError, SafetensorError, OSError) as exc:
        raise CheckpointError(f"unreadable ({type(exc).__name__}: {exc})") from None
    if info is None and client_state is not None:
        raise CheckpointError("it holds no client state, but the run keeps per-client state")
    if info is not None and client_state is None:
        raise CheckpointError("it holds client state, but the run keeps none")
    if client_state is not None and info is not None:
        shape = (client_state.num_clients, client_state.size)
        if (info["num_clients"], info["size"]) != shape:
            raise CheckpointError(
                f"its client state is {info['num_clients']} x {info['size']}; the run's is "
                f"{shape[0]} x {shape[1]}"
            )
        load_rows(client_state, path / CLIENT_STATE_NAME, info["ids"])
    optimizer = {
        k.removeprefix(_OPTIMIZER): v for k, v in tensors.items() if k.startswith(_OPTIMIZER)
    }
    return Checkpoint(
        next_round,
        tensors["params"],
        optimizer,
        dict(meta.get("loop") or {}),
        tensors.get("torch_rng_state"),
        path,
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def load_latest(
    run_dir: Path | str,
    client_state: ClientStateStore | None = None,
    warn_fn: Callable[[str], None] = _stderr,
) -> Checkpoint:
    """The newest checkpoint that passes its checks. Each unusable newer one is
    reported through ``warn_fn`` in one line; none usable raises CheckpointError."""
    found = list_checkpoints(run_dir)
    if not found:
        raise CheckpointError(
            f"run '{run_dir}' has no checkpoint to resume from (it stopped before its first "
            "checkpoint, or checkpoint_every is 0); start it again with 'fedforge run'"
        )
    problems: list[str] = []
    for path in found:
        try:
            ckpt = load_checkpoint(path, client_state)
        except CheckpointError as exc:
            problems.append(f"{path.name}: {exc}")
            continue
        if problems:
            warn_fn(f"fedforge: unusable checkpoint ({'; '.join(problems)}); using {path.name}")
        return ckpt
    raise CheckpointError(
        f"no usable checkpoint in '{Path(run_dir) / CHECKPOINTS_DIR}': " + "; ".join(problems)
    )

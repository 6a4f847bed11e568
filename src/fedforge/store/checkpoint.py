"""Checkpoints: everything the round loop needs to continue a run exactly.

``<run_dir>/checkpoints/round-000010/`` is the state before round 10 runs:

- ``state.safetensors``: global ``params``, ``optimizer/<name>`` for each server
  optimizer state tensor, ``torch_rng_state``;
- ``algorithm/<name>`` in the same file: an algorithm's server state (SCAFFOLD's c);
- ``in_flight/<client>`` in the same file: under buffered asynchronous
  aggregation, the encoded update of each client still at work (uint8);
- for each named per-client table the run keeps, its written rows as a chain
  of segment files (store/segments.py): ``client_state.r<round>.bin`` for
  error-feedback residuals (``residual``), ``client_state.<name>.r<round>.bin``
  for the others (SCAFFOLD's ``control``), each the rows that changed before
  that round's checkpoint, the older ones hard links to the previous
  checkpoint's files;
- ``meta.json``: format, ``next_round``, the loop's plain state (evaluation
  history, byte totals, rejected updates, wall time), each table's segments with
  their row ids, and the sha256 and size of each file above. Written last: a
  checkpoint without it does not exist. The older format 1 (one ``client_state*.bin``
  of every row a table) still loads.

A checkpoint is written into a temporary directory, every file fsynced, then
renamed into place (and the parent directory fsynced), so a kill at any point
leaves either the old set or the new one. The newest ``keep`` (2) are kept.
Loading verifies sizes and checksums; an unusable newest checkpoint is reported
in one line and the one before it is used.

Randomness is derived from (seed, round, client, purpose) (``fedforge.core.rng``), so
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fedforge.core.errors import StoreError
from fedforge.store.client_state import ClientStateStore, rows_sha256
from fedforge.store.segments import Chain, committed, parse_chain, read_table, write_table

FORMAT = 2
READABLE = (1, 2)
KEEP = 2
CHECKPOINTS_DIR = "checkpoints"
TENSORS_NAME, CLIENT_STATE_NAME, META_NAME = "state.safetensors", "client_state.bin", "meta.json"
_NAME = re.compile(r"^round-(\d{6,})$")
_OPTIMIZER = "optimizer/"
_ALGORITHM = "algorithm/"
_AGGREGATOR = "aggregator/"
_IN_FLIGHT = "in_flight/"
RESIDUAL = "residual"  # the table of error feedback, kept in client_state.bin

# Per-client tables by name; a single store is the error-feedback table.
ClientTables = Mapping[str, ClientStateStore] | ClientStateStore | None


def _tables(client_state: ClientTables) -> dict[str, ClientStateStore]:
    if client_state is None:
        return {}
    if isinstance(client_state, Mapping):
        return dict(client_state)
    return {RESIDUAL: client_state}


def _dtype_name(table: ClientStateStore) -> str:
    """A table's dtype as meta.json records it (``float32``)."""
    return str(table.dtype).removeprefix("torch.")


def table_file(name: str) -> str:
    """The checkpoint file of the per-client table ``name``."""
    return CLIENT_STATE_NAME if name == RESIDUAL else f"client_state.{name}.bin"


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
    algorithm_state: dict[str, torch.Tensor] = field(default_factory=dict)  # SCAFFOLD's c
    # the aggregator's cross-round state (adaptive norm bound, centred clipping's centre)
    aggregator_state: dict[str, torch.Tensor] = field(default_factory=dict)
    # buffered asynchronous aggregation: the updates of the clients at work, as bytes
    in_flight: dict[str, torch.Tensor] = field(default_factory=dict)


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
    client_state: ClientTables = None,
    keep: int = KEEP,
) -> Path:
    """Write ``ckpt`` (and the rows of each per-client table) atomically; keep the
    newest ``keep``. The older ones beyond ``keep - 1`` go first: at most
    ``max(keep, 2)`` checkpoints are on disk while the new one is written (a full
    rewrite of a table holds every row ever written: gigabytes at scale), one
    more when this round's own is written again, and a failed write leaves the
    ones before it whole."""
    tables = _tables(client_state)
    root = Path(run_dir) / CHECKPOINTS_DIR
    if root.is_dir():  # the newest keep - 1 before this round, and this round's own
        _prune(root, ckpt.next_round, max(keep - 1, 1), before=True)
    final = root / checkpoint_name(ckpt.next_round)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    tensors = {"params": ckpt.params.detach().contiguous().clone()}
    for name, value in ckpt.optimizer_state.items():
        tensors[_OPTIMIZER + name] = value.detach().contiguous().clone()
    for name, value in ckpt.algorithm_state.items():
        tensors[_ALGORITHM + name] = value.detach().contiguous().clone()
    for name, value in ckpt.aggregator_state.items():
        tensors[_AGGREGATOR + name] = value.detach().contiguous().clone()
    for name, value in ckpt.in_flight.items():
        tensors[_IN_FLIGHT + name] = value.detach().contiguous().clone()
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
        if tables:
            meta["client_state"] = {}
        chains: dict[str, Chain] = {}
        for name, table in tables.items():
            chains[name] = write_table(table, table_file(name), tmp, ckpt.next_round)
            for seg in chains[name].segments:
                meta["files"][seg.file] = {"bytes": seg.bytes, "sha256": seg.sha256}
            meta["client_state"][name] = {
                "segments": [{"file": s.file, "ids": s.ids} for s in chains[name].segments],
                "age": chains[name].age,
                "num_clients": table.num_clients,
                "size": table.size,
                "dtype": _dtype_name(table),
            }
        meta[_META_SHA] = _meta_digest(meta)  # the ids of the rows live only here
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
    for name, table in tables.items():  # the next checkpoint builds on this one
        committed(table, final, chains[name])
    _prune(root, ckpt.next_round, keep)
    ckpt.path = final
    return final


def _prune(root: Path, newest: int, keep: int, before: bool = False) -> None:
    """Drop leftovers of interrupted writes, checkpoints past ``newest`` (an abandoned
    future after a resume) and all but the newest ``keep``. ``before`` (round
    ``newest`` is about to be written): ``newest``'s own, if any, stays beside the
    ``keep`` older ones until the new one replaces it. A resume that fell back
    from a damaged checkpoint writes that round again, and must not delete the
    one it resumed from first (it may be the only good one left if the write
    fails, and its segments are what the new one links)."""
    for p in root.iterdir():
        if p.name.startswith((".tmp-", ".old-")):
            shutil.rmtree(p, ignore_errors=True)
    kept = 0
    for p in list_checkpoints(root.parent):
        m = _NAME.match(p.name)
        r = -1 if m is None else int(m.group(1))
        if before and r == newest:
            continue
        if m is None or r > newest or kept >= keep:
            shutil.rmtree(p, ignore_errors=True)
        else:
            kept += 1


_META_SHA = "meta_sha256"


def _meta_digest(meta: dict[str, Any]) -> str:
    """The sha256 of ``meta`` without its own digest, in a canonical JSON form."""
    body = {k: v for k, v in meta.items() if k != _META_SHA}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _verified(path: Path, entry: Any) -> bytes | None:
    """Checks size and sha256 of a file against its meta entry; returns its bytes
    when small enough to hold (tensors: a ``.safetensors`` file), else None after
    streaming the hash."""
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path.name}: no size and checksum in {META_NAME}")
    if not path.is_file():
        raise CheckpointError(f"{path.name} is missing")
    size = path.stat().st_size
    if size != entry.get("bytes"):
        raise CheckpointError(f"{path.name} has {size} bytes; expected {entry.get('bytes')}")
    if path.suffix == ".safetensors":
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
    else:
        data, digest = None, rows_sha256(path)
    if digest != entry.get("sha256"):
        raise CheckpointError(f"{path.name} fails its sha256 check")
    return data


def load_checkpoint(path: Path | str, client_state: ClientTables = None) -> Checkpoint:
    """Read and verify one checkpoint directory; restore its rows into the run's
    per-client tables ``client_state`` (by name; a single store: ``residual``)."""
    path = Path(path)
    tables = _tables(client_state)
    try:
        meta = json.loads((path / META_NAME).read_text())
        if not isinstance(meta, dict) or meta.get("format") not in READABLE:
            raise CheckpointError(
                f"{META_NAME} is not a checkpoint of format {' or '.join(map(str, READABLE))}"
            )
        if _META_SHA in meta and meta[_META_SHA] != _meta_digest(meta):
            raise CheckpointError(f"{META_NAME} fails its sha256 check")
        if _META_SHA not in meta and meta["format"] != 1:  # only early format 1 had none
            raise CheckpointError(f"{META_NAME} has no sha256 of its own")
        files = meta.get("files") or {}
        blob = _verified(path / TENSORS_NAME, files.get(TENSORS_NAME))
        tensors = st_load(blob or b"")
        info = meta.get("client_state")
        if isinstance(info, dict) and "ids" in info:  # written before tables had names
            info = {RESIDUAL: info}
        chains: dict[str, Chain] = {}
        for name, entry in (info or {}).items():
            if not isinstance(entry, dict):
                raise CheckpointError(f"its client state '{name}' is not a table entry")
            chains[name] = parse_chain(name, entry, files, table_file(name))
            for seg in chains[name].segments:
                _verified(path / seg.file, files.get(seg.file))
        next_round = int(meta["next_round"])
    except FileNotFoundError:
        raise CheckpointError(f"{META_NAME} is missing") from None
    except CheckpointError:
        raise
    except StoreError as exc:  # a table's entry in meta.json
        raise CheckpointError(str(exc)) from None
    except (ValueError, KeyError, TypeError, SafetensorError, OSError) as exc:
        raise CheckpointError(f"unreadable ({type(exc).__name__}: {exc})") from None
    if info is None and tables:
        raise CheckpointError("it holds no client state, but the run keeps per-client state")
    if info is not None and not tables:
        raise CheckpointError("it holds client state, but the run keeps none")
    if info is not None and set(info) != set(tables):
        raise CheckpointError(
            f"it holds client state tables {sorted(info)}; the run keeps {sorted(tables)}"
        )
    for name, table in tables.items():
        got = info[name] if info is not None else {}
        if not isinstance(got, dict) or not {"num_clients", "size"} <= set(got):
            raise CheckpointError(f"its client state '{name}' lacks num_clients or size")
        shape = (table.num_clients, table.size)
        if (got["num_clients"], got["size"]) != shape:
            raise CheckpointError(
                f"its client state '{name}' is {got['num_clients']} x {got['size']}; the "
                f"run's is {shape[0]} x {shape[1]}"
            )
        dtype = _dtype_name(table)
        if got.get("dtype", dtype) != dtype:
            raise CheckpointError(
                f"its client state '{name}' holds {got['dtype']} numbers; the run's are {dtype}"
            )
    for name, table in tables.items():  # every check passed: now the rows
        read_table(table, path, chains[name])
    for name, table in tables.items():
        committed(table, path, chains[name])
    optimizer = {
        k.removeprefix(_OPTIMIZER): v for k, v in tensors.items() if k.startswith(_OPTIMIZER)
    }
    algorithm = {
        k.removeprefix(_ALGORITHM): v for k, v in tensors.items() if k.startswith(_ALGORITHM)
    }
    aggregator = {
        k.removeprefix(_AGGREGATOR): v for k, v in tensors.items() if k.startswith(_AGGREGATOR)
    }
    in_flight = {
        k.removeprefix(_IN_FLIGHT): v for k, v in tensors.items() if k.startswith(_IN_FLIGHT)
    }
    return Checkpoint(
        next_round,
        tensors["params"],
        optimizer,
        dict(meta.get("loop") or {}),
        tensors.get("torch_rng_state"),
        path,
        algorithm,
        aggregator,
        in_flight,
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def load_latest(
    run_dir: Path | str,
    client_state: ClientTables = None,
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
        except StoreError as exc:  # CheckpointError, or rows the tables refused
            problems.append(f"{path.name}: {exc}")
            continue
        if problems:
            warn_fn(f"fedforge: unusable checkpoint ({'; '.join(problems)}); using {path.name}")
        return ckpt
    raise CheckpointError(
        f"no usable checkpoint in '{Path(run_dir) / CHECKPOINTS_DIR}': " + "; ".join(problems)
    )

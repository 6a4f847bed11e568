"""A client process's persistent state on its own disk: the rows of its hosted
clients in the run's per-client tables (error-feedback residuals, SCAFFOLD's
c_k, FedBN's local batch norm), so a restarted client carries on where it was.

One safetensors file per process in ``--state-dir``, written atomically (a
temporary file, fsync, rename, fsync of the folder) after every change: a crash
leaves the previous state or the new one, never a mix. The file names the run
config it belongs to (its SHA-256); a file of another run is set aside, not
loaded. Only written rows travel (a row never written reads as its initial
value, as in the simulator's tables).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from fedforge.algorithms.local import ClientTerms
from fedforge.store.client_state import ClientStateStore
from fedforge.transport.logs import log_event

PENDING = "pending"  # the rows of state computed and not yet committed
OUTBOX = "outbox/"  # outbox/<client>/<round>: an update not yet known to be taken


def span_of(ids: Sequence[int]) -> str:
    """'0-2_7' for [0, 1, 2, 7]: the hosted ids, as runs."""
    runs: list[list[int]] = []
    for c in sorted(set(ids)):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return "_".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


class ClientStateFile:
    """Saves and loads ``tables``' rows of the clients ``ids``."""

    def __init__(
        self,
        folder: Path,
        tables: Mapping[str, ClientStateStore],
        ids: Sequence[int],
        config_yaml: str,
        pending: ClientTerms | None = None,
    ) -> None:
        # one file per process: named by the ids it hosts
        self.path = folder / f"client-state-{span_of(ids)}.safetensors"
        # state computed and not yet committed (SCAFFOLD's c_k+): pending() and
        # restore_pending() of the algorithm's client half
        self.pending = pending
        # (client, round) -> the update computed with the saved state and not yet
        # known to be taken: after a restart it is sent again, not recomputed (the
        # state it was computed from has moved on)
        self.outbox: dict[tuple[int, int], bytes] = {}
        # client -> the round whose state waits for the server's COMMIT
        self.trained_round: dict[int, int] = {}
        self.tables = dict(tables)
        self.ids = list(ids)
        self.config_sha = hashlib.sha256(config_yaml.encode()).hexdigest()
        folder.mkdir(parents=True, exist_ok=True)

    def load(self) -> int:
        """Put the saved rows back; how many rows were loaded."""
        if not self.path.is_file():
            return 0
        try:
            from safetensors import safe_open

            with safe_open(str(self.path), "pt") as f:
                meta = f.metadata() or {}
            tensors = load_file(str(self.path))
        except Exception as exc:  # a damaged file: set aside, start from the initial state
            return self._set_aside(f"unreadable ({type(exc).__name__}: {exc})")
        if meta.get("config_sha256") != self.config_sha:
            return self._set_aside("it belongs to another run config")
        written = json.loads(meta.get("written", "{}"))
        loaded = 0
        for name, table in self.tables.items():
            ids = [int(c) for c in written.get(name, [])]
            if ids and name in tensors:
                table.scatter(ids, tensors[name].to(table.dtype))
                loaded += len(ids)
        rounds = json.loads(meta.get("trained_round", "{}"))
        self.trained_round = {int(c): int(r) for c, r in rounds.items()}
        held = [int(c) for c in json.loads(meta.get("pending", "[]"))]
        if held and self.pending is not None and PENDING in tensors:
            rows = tensors[PENDING]
            self.pending.restore_pending({c: rows[i] for i, c in enumerate(held)})
            loaded += len(held)
        for name, t in tensors.items():
            if name.startswith(OUTBOX):
                cid, r = (int(v) for v in name[len(OUTBOX) :].split("/"))
                self.outbox[(cid, r)] = t.numpy().tobytes()
        return loaded

    def _set_aside(self, why: str) -> int:
        aside = self.path.with_suffix(".set-aside")
        os.replace(self.path, aside)
        log_event("client", "state_set_aside", file=str(aside), reason=why)
        return 0

    def save(self) -> None:
        """Write the hosted clients' written rows, atomically."""
        tensors: dict[str, torch.Tensor] = {}
        written: dict[str, list[int]] = {}
        for name, table in self.tables.items():
            ids = [c for c in self.ids if table.has(c)]
            written[name] = ids
            if ids:
                tensors[name] = table.gather(ids).contiguous()
        held: dict[int, torch.Tensor] = {}
        if self.pending is not None:
            held = self.pending.pending()
            if held:
                tensors[PENDING] = torch.stack([held[c] for c in sorted(held)])
        for (cid, r), data in self.outbox.items():
            tensors[f"{OUTBOX}{cid}/{r}"] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        meta = {
            "config_sha256": self.config_sha,
            "written": json.dumps(written),
            "pending": json.dumps(sorted(held)),
            "trained_round": json.dumps({str(c): r for c, r in self.trained_round.items()}),
        }
        save_atomic(self.path, tensors, meta)


def save_atomic(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    """Write a safetensors file so that a crash leaves the old one or the new one:
    a temporary file, synced, renamed over ``path``, the folder synced."""
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata=meta)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

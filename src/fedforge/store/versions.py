"""The global models a deployment serves, kept as versions in the run store.

A global model a deployment rolls out (every ``deployment.canary_every`` rounds)
is a *version*: a row of
``model_versions`` (``database.py``) and its parameters in
``versions/v{id}.safetensors`` under the run directory (the row names the file
relative to the run directory, so a moved run keeps its versions). A new version
is served first to a fraction of the clients (the canary), judged on their data
(``transport/canary.py``), then promoted to every client or rolled back.

Statuses, and what moves a version between them (each change is one SQLite
transaction; the database keeps at most one ``promoted`` and one ``canary``):

- ``candidate``: stored, served to no one. :func:`start_canary` makes it the
  canary, :func:`promote` the serving version.
- ``canary``: served to the canary fraction of the clients; promoted or rolled back.
- ``promoted``: serving every client outside the canary (:func:`serving`).
  Promoting another version makes it ``superseded``.
- ``superseded``: served every client once, then replaced. It may be promoted
  again (an explicit return to it), and a rollback returns to one.
- ``rolled_back``: withdrawn for good and never promoted again (its parameters
  may be added as a new version to try them again).

:func:`rollback` of the canary ends the canary: its clients go back to the
serving version, which stays as it is. A rollback of the promoted version gives
the serving role back to its nearest ancestor (its parent, the parent's parent,
...) that served every client before, i.e. is ``superseded``; ancestors rolled
back or never served are skipped. Without such an ancestor, or (for a canary)
without a promoted version, the rollback is refused and nothing changes: after a
rollback some version serves every client.

Crash safety: the parameters are written to a hidden temporary file and fsynced
outside the database's write lock (a large model does not hold up the rounds'
writes); then, in one transaction, the next id is taken, the file renamed to
``v{id}.safetensors``, the folder fsynced, and only then the row inserted. A
crash leaves at worst a file without a row, never a row without its file: no
version names such a file, and the next version of that id replaces it.
Temporary files are never read. The row keeps the file's dtype, shape and
sha256, which :func:`load_version_params` checks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Mapping
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fedforge.core.errors import StoreError, shown
from fedforge.store.checkpoint import _fsync_dir, _write
from fedforge.store.database import MODEL_VERSIONS
from fedforge.store.disk import os_error_text
from fedforge.store.runstore import RunStore

VERSIONS_DIR = "versions"
STATUSES = ("candidate", "canary", "promoted", "rolled_back", "superseded")
NEW_STATUSES = ("candidate", "canary", "promoted")  # what add_version may give
_COLS = "version_id, parent_id, round_idx, created, status, metrics_json"
_FILE_COLS = "params_file, params_dtype, params_shape, params_sha256"


@dataclasses.dataclass(frozen=True)
class ModelVersion:
    """One stored global model: its id, the version it came from, the round that
    made it, when it was stored (Unix time), its status and its metrics."""

    version_id: int
    parent_id: int | None
    round_idx: int
    created: float
    status: str
    metrics: dict[str, float]


def version_file(version_id: int) -> str:
    """The parameters file of a version, relative to the run directory."""
    return f"{VERSIONS_DIR}/v{version_id}.safetensors"


def _metrics_json(metrics: Mapping[str, float]) -> str:
    """Metrics as JSON: text names, numbers (a NaN or inf is kept as one)."""
    clean: dict[str, float] = {}
    for name, value in metrics.items():
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not isinstance(name, str) or not name or not ok:
            raise StoreError(
                f"model version metric {shown(name)} = {shown(value)} is invalid: "
                "a metric is a non-empty name and a number"
            )
        clean[name] = float(value)
    return json.dumps(clean, sort_keys=True)


def _version(store: RunStore, row: tuple[Any, ...]) -> ModelVersion:
    """A row of ``model_versions`` as a ModelVersion; a damaged one is refused."""
    version_id, parent_id, round_idx, created, status, metrics_json = row
    try:
        metrics = json.loads(metrics_json)
        ok = isinstance(metrics, dict) and all(isinstance(v, float) for v in metrics.values())
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise StoreError(f"run store '{store.path}' holds damaged metrics of version {version_id}")
    return ModelVersion(version_id, parent_id, round_idx, created, status, metrics)


def _has_table(store: RunStore) -> bool:
    return bool(store._query("SELECT 1 FROM sqlite_master WHERE name = 'model_versions'"))


def _select(store: RunStore, where: str = "", args: tuple[Any, ...] = ()) -> list[ModelVersion]:
    if not _has_table(store):
        return []  # no version written yet
    rows = store._query(f"SELECT {_COLS} FROM model_versions {where} ORDER BY version_id", args)
    return [_version(store, tuple(row)) for row in rows]


def _unknown(store: RunStore, version_id: int) -> StoreError:
    ids = [v.version_id for v in _select(store)]
    known = f"it has versions {ids[0]} to {ids[-1]}" if ids else "it has no model versions"
    return StoreError(f"run '{store.path.name}' has no model version {version_id} ({known})")


def _one(store: RunStore, status: str) -> ModelVersion | None:
    found = _select(store, "WHERE status = ?", (status,))
    return found[-1] if found else None


def list_versions(store: RunStore) -> list[ModelVersion]:
    """Every version of the run, oldest first ([] before the first)."""
    return _select(store)


def get_version(store: RunStore, version_id: int) -> ModelVersion:
    """Version ``version_id``; an unknown id raises StoreError naming the known ones."""
    found = _select(store, "WHERE version_id = ?", (version_id,))
    if not found:
        raise _unknown(store, version_id)
    return found[0]


def serving(store: RunStore) -> ModelVersion | None:
    """The promoted version, which serves every client outside the canary."""
    return _one(store, "promoted")


def canary(store: RunStore) -> ModelVersion | None:
    """The version in canary, served to the canary fraction of the clients."""
    return _one(store, "canary")


def _insert(conn: sqlite3.Connection, row: tuple[Any, ...]) -> None:
    """Insert one row of ``model_versions`` (inside the caller's transaction)."""
    marks = ", ".join("?" * len(row))
    conn.execute(f"INSERT INTO model_versions ({_COLS}, {_FILE_COLS}) VALUES ({marks})", row)


def _set_status(conn: sqlite3.Connection, version_id: int, status: str) -> None:
    conn.execute("UPDATE model_versions SET status = ? WHERE version_id = ?", (status, version_id))


def _no_second_canary(store: RunStore, version_id: int) -> None:
    running = canary(store)
    if running is not None:
        raise StoreError(
            f"cannot make version {version_id} the canary: version {running.version_id} is "
            "in canary; promote it or roll it back first"
        )


def add_version(
    store: RunStore,
    params: torch.Tensor,
    round_idx: int,
    parent_id: int | None = None,
    metrics: Mapping[str, float] | None = None,
    status: str = "candidate",
) -> ModelVersion:
    """Store ``params`` as the next version (ids count from 1): its file first, then
    its row. ``status`` 'canary' refuses when another version is in canary;
    'promoted' supersedes the serving version in the same transaction."""
    if not isinstance(params, torch.Tensor):
        raise StoreError(f"model version parameters must be a tensor, not {type(params).__name__}")
    if status not in NEW_STATUSES:
        raise StoreError(
            f"a new model version's status {status!r} is invalid; allowed: "
            + ", ".join(NEW_STATUSES)
        )
    if isinstance(round_idx, bool) or not isinstance(round_idx, int) or round_idx < 0:
        raise StoreError(f"model version round_idx {round_idx!r} is invalid: an integer >= 0")
    metrics_json = _metrics_json(metrics or {})
    tensor = params.detach().to("cpu").contiguous().clone()
    blob = st_save({"params": tensor})
    dtype, shape = str(tensor.dtype).removeprefix("torch."), json.dumps(list(tensor.shape))
    folder = store.path / VERSIONS_DIR
    tmp = folder / f".pending-{secrets.token_hex(6)}.safetensors.tmp"
    what = f"model version parameters in '{folder}'"
    try:
        try:
            folder.mkdir()
            _fsync_dir(store.path)
        except FileExistsError:
            pass
        _write(tmp, blob)
        with store._transaction(f"cannot add a model version to '{store.path}'"):
            for ddl in MODEL_VERSIONS:
                store._conn.execute(ddl)
            if parent_id is not None and not _select(store, "WHERE version_id = ?", (parent_id,)):
                raise StoreError(
                    f"cannot add a model version with parent {parent_id}: "
                    f"{_unknown(store, parent_id)}"
                )
            (last,) = store._query("SELECT MAX(version_id) FROM model_versions")[0]
            version_id = (last or 0) + 1
            if status == "canary":
                _no_second_canary(store, version_id)
            if status == "promoted":
                store._conn.execute(
                    "UPDATE model_versions SET status = 'superseded' WHERE status = 'promoted'"
                )
            name = version_file(version_id)
            what = f"'{store.path / name}'"
            os.replace(tmp, store.path / name)
            _fsync_dir(folder)
            created = time.time()
            row = (version_id, parent_id, round_idx, created, status, metrics_json)
            sha = hashlib.sha256(blob).hexdigest()
            _insert(store._conn, (*row, name, dtype, shape, sha))
    except OSError as exc:
        raise StoreError(f"cannot write {what}: {os_error_text(exc)}") from None
    finally:
        tmp.unlink(missing_ok=True)  # a version's file is never removed here: see above
    return ModelVersion(*row[:5], json.loads(metrics_json))


def load_version_params(store: RunStore, version_id: int) -> torch.Tensor:
    """The parameters of version ``version_id``, checked against its row (sha256,
    dtype, shape); a missing or damaged file raises StoreError naming it."""
    rows = (
        store._query(f"SELECT {_FILE_COLS} FROM model_versions WHERE version_id = ?", (version_id,))
        if _has_table(store)
        else []
    )
    if not rows:
        raise _unknown(store, version_id)
    name, dtype, shape, sha = rows[0]
    if name != version_file(version_id):  # a damaged row: never read a file it points to
        raise StoreError(
            f"run store '{store.path}' is damaged: version {version_id} names the file "
            f"{name!r}, not {version_file(version_id)!r}"
        )
    path = store.path / name
    what = f"parameters file '{path}' of model version {version_id}"
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise StoreError(f"the {what} is missing") from None
    except OSError as exc:
        raise StoreError(f"the {what} cannot be read: {os_error_text(exc)}") from None
    if hashlib.sha256(blob).hexdigest() != sha:
        raise StoreError(f"the {what} is damaged: it fails its sha256 check")
    try:
        tensor = st_load(blob)["params"]
    except (SafetensorError, KeyError, ValueError) as exc:
        raise StoreError(f"the {what} is damaged: unreadable ({type(exc).__name__})") from None
    got_dtype, got_shape = str(tensor.dtype).removeprefix("torch."), json.dumps(list(tensor.shape))
    if (got_dtype, got_shape) != (dtype, shape):
        raise StoreError(
            f"the {what} is damaged: it holds {got_dtype} {got_shape}, its row says {dtype} {shape}"
        )
    return tensor


def start_canary(store: RunStore, version_id: int) -> ModelVersion:
    """Make candidate ``version_id`` the canary; refused for any other status, or
    while another version is in canary."""
    with store._transaction(f"cannot start the canary of version {version_id}"):
        target = get_version(store, version_id)
        if target.status != "candidate":
            raise StoreError(
                f"cannot make version {version_id} the canary: its status is {target.status}; "
                "only a candidate becomes the canary"
            )
        _no_second_canary(store, version_id)
        _set_status(store._conn, version_id, "canary")
    return dataclasses.replace(target, status="canary")


def promote(store: RunStore, version_id: int) -> ModelVersion:
    """Make ``version_id`` the serving version; the one serving before becomes
    'superseded'. Promoting the serving version changes nothing; a rolled-back or
    unknown version is refused."""
    with store._transaction(f"cannot promote version {version_id}"):
        target = get_version(store, version_id)
        if target.status == "promoted":
            return target
        if target.status == "rolled_back":
            raise StoreError(
                f"cannot promote version {version_id}: its status is rolled_back, which is "
                "final; add its parameters as a new version to try them again"
            )
        store._conn.execute(
            "UPDATE model_versions SET status = 'superseded' WHERE status = 'promoted'"
        )
        _set_status(store._conn, version_id, "promoted")
    return dataclasses.replace(target, status="promoted")


def _ancestors(store: RunStore, version: ModelVersion) -> list[ModelVersion]:
    """The parent of ``version``, its parent, ... (a damaged loop ends the list)."""
    by_id = {v.version_id: v for v in _select(store)}
    chain: list[ModelVersion] = []
    seen = {version.version_id}
    parent_id = version.parent_id
    while parent_id is not None and parent_id in by_id and parent_id not in seen:
        seen.add(parent_id)
        chain.append(by_id[parent_id])
        parent_id = by_id[parent_id].parent_id
    return chain


def rollback(store: RunStore, version_id: int | None = None) -> tuple[ModelVersion, ModelVersion]:
    """Roll back ``version_id`` (the canary or the promoted version; None: the
    canary if there is one, else the promoted version), as the module says.
    Returns (the version rolled back, the version serving every client now)."""
    what = "the live version" if version_id is None else f"version {version_id}"
    with store._transaction(f"cannot roll back {what}"):
        if version_id is None:
            target = canary(store) or serving(store)
            if target is None:
                raise StoreError(
                    f"nothing to roll back in run '{store.path.name}': no version is in canary "
                    "or promoted"
                )
        else:
            target = get_version(store, version_id)
        vid = target.version_id
        if target.status == "canary":
            back_to = serving(store)
            if back_to is None:
                raise StoreError(
                    f"cannot roll back canary version {vid}: no version is promoted to serve "
                    "its clients instead"
                )
            _set_status(store._conn, vid, "rolled_back")
        elif target.status == "promoted":
            chain = _ancestors(store, target)
            back_to = next((v for v in chain if v.status == "superseded"), None)
            if back_to is None:
                seen = ", ".join(f"{v.version_id} {v.status}" for v in chain)
                why = f"no ancestor served every client before: {seen}" if chain else "no parent"
                raise StoreError(f"cannot roll back version {vid}: nothing to roll back to ({why})")
            _set_status(store._conn, vid, "rolled_back")  # first: one promoted at a time
            _set_status(store._conn, back_to.version_id, "promoted")
        else:
            raise StoreError(
                f"cannot roll back version {vid}: its status is {target.status}; only the "
                "canary or the promoted version is rolled back"
            )
    return (
        dataclasses.replace(target, status="rolled_back"),
        dataclasses.replace(back_to, status="promoted"),
    )


def update_metrics(store: RunStore, version_id: int, metrics: Mapping[str, float]) -> ModelVersion:
    """Merge ``metrics`` into version ``version_id``'s (a name given again takes the
    new value): a canary's evaluation results, for one."""
    with store._transaction(f"cannot update the metrics of version {version_id}"):
        target = get_version(store, version_id)
        merged = {**target.metrics, **json.loads(_metrics_json(metrics))}
        store._conn.execute(
            "UPDATE model_versions SET metrics_json = ? WHERE version_id = ?",
            (_metrics_json(merged), version_id),
        )
    return dataclasses.replace(target, metrics=merged)

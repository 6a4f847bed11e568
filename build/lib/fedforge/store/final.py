"""A finished run's final parameters, written as checkpoints are written.

``final_params.safetensors`` holds the global vector (``params``) and, with
FedBN, each client's own batch-norm entries (``personal/mask``,
``personal/client_ids``, ``personal/rows``); ``final_params.json`` holds the
parameter names and the file's size and sha256, and its own sha256. Both are
written to temporary names, fsynced, and renamed into place, the JSON last: a
run's final parameters without it do not exist. :func:`load_final` verifies
both and refuses a damaged file. Runs from before the checksums have a
``final_params.pt`` (``torch.save``), which still loads, unverified: it has
nothing to verify against.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fedforge.core.errors import StoreError
from fedforge.store.checkpoint import (
    _META_SHA,
    CheckpointError,
    _fsync_dir,
    _meta_digest,
    _verified,
    _write,
)
from fedforge.store.disk import os_error_text

FINAL_NAME, FINAL_META = "final_params.safetensors", "final_params.json"
LEGACY_NAME = "final_params.pt"  # torch.save, no checksum
FORMAT = 1
_PERSONAL = "personal/"


def _write_failed(what: Path, exc: OSError) -> StoreError:
    """The one-line error of a failed write: a full disk said in words."""
    return StoreError(f"cannot write {what.name} in '{what.parent}': {os_error_text(exc)}")


def save_final(
    run_dir: Path, params: torch.Tensor, names: list[str], personal: dict[str, Any] | None
) -> Path:
    """Write the final parameters of the run in ``run_dir`` (``personal``: FedBN's
    per-client entries); on failure nothing half-written is left, and a
    StoreError names the file (a full disk: 'the disk is full')."""
    tensors = {"params": params.detach().contiguous().clone()}
    for key, value in (personal or {}).items():
        tensors[_PERSONAL + key] = value.detach().contiguous().clone()
    blob = st_save(tensors)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "names": list(names),
        "files": {FINAL_NAME: {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}},
    }
    meta[_META_SHA] = _meta_digest(meta)
    path, meta_path = run_dir / FINAL_NAME, run_dir / FINAL_META
    tmp, meta_tmp = run_dir / f"{FINAL_NAME}.tmp", run_dir / f"{FINAL_META}.tmp"
    current = path
    try:
        _write(tmp, blob)
        current = meta_path
        _write(meta_tmp, json.dumps(meta).encode())
        meta_path.unlink(missing_ok=True)  # final parameters rewritten are new ones
        tmp.replace(path)
        meta_tmp.replace(meta_path)
        _fsync_dir(run_dir)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        meta_tmp.unlink(missing_ok=True)
        raise _write_failed(current, exc) from None
    return path


def load_final(run_dir: Path | str) -> dict[str, Any]:
    """The final parameters of a finished run, verified: ``params``, ``names`` and,
    with FedBN, ``personal`` (``mask``, ``client_ids``, ``rows``). A damaged file
    or a missing one raises StoreError."""
    run_dir = Path(run_dir)
    path, meta_path = run_dir / FINAL_NAME, run_dir / FINAL_META
    if not meta_path.is_file() and (run_dir / LEGACY_NAME).is_file():
        return _load_legacy(run_dir / LEGACY_NAME)
    if not meta_path.is_file():
        raise StoreError(f"'{run_dir}' has no final parameters: the run did not finish")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CheckpointError(f"{FINAL_META} is not of format {FORMAT}")
        if meta.get(_META_SHA) != _meta_digest(meta):
            raise CheckpointError(f"{FINAL_META} fails its sha256 check")
        blob = _verified(path, (meta.get("files") or {}).get(FINAL_NAME))
        tensors = st_load(blob or b"")
        names = meta["names"]
        params = tensors["params"]
    except CheckpointError as exc:
        raise StoreError(f"final parameters in '{run_dir}' are damaged: {exc}") from None
    except (ValueError, KeyError, TypeError, SafetensorError, OSError) as exc:
        raise StoreError(
            f"final parameters in '{run_dir}' are damaged: unreadable ({type(exc).__name__}: {exc})"
        ) from None
    final: dict[str, Any] = {"params": params, "names": names}
    personal = {k[len(_PERSONAL) :]: v for k, v in tensors.items() if k.startswith(_PERSONAL)}
    if personal:
        final["personal"] = personal
    return final


def _load_legacy(path: Path) -> dict[str, Any]:
    """A ``final_params.pt`` of a run from before the checksums (tensors and names
    only: ``weights_only``)."""
    try:
        final = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises anything from a damaged zip or pickle
        raise StoreError(f"'{path}' is damaged: unreadable ({type(exc).__name__})") from None
    if not isinstance(final, dict) or not isinstance(final.get("params"), torch.Tensor):
        raise StoreError(f"'{path}' is damaged: it holds no parameter vector")
    return final

"""Finding runs in a runs directory: ``fedforge runs`` lists them and
``fedforge show`` / ``fedforge resume`` resolve a run from part of its name."""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
from collections.abc import Sequence
from pathlib import Path

from fedforge.core.errors import StoreError
from fedforge.store.damage import StoreDamaged, written_now
from fedforge.store.database import DB_NAME
from fedforge.store.directory import config_name, is_run_dir
from fedforge.store.records import RunInfo
from fedforge.store.runstore import RunStore


def _run_info(path: Path) -> RunInfo:
    """The run's line in ``fedforge runs``; 'damaged' or 'unreadable' when it cannot be read."""
    try:
        with RunStore.open(path, read_only=True) as store:
            info = store.info()
    except (StoreError, ValueError, AttributeError) as exc:
        name = config_name(path) or path.name
        status = "damaged" if isinstance(exc, StoreDamaged) else "unreadable"
        return RunInfo(path.name, name, path, "", status, 0, None, None)
    return dataclasses.replace(info, status=live_status(path, info.status))


def live_status(path: Path, status: str) -> str:
    """The stored ``status``, or 'died' for a 'running' run no process holds
    (killed: SIGKILL, out of memory)."""
    return "died" if status == "running" and not written_now(path) else status


def list_runs(runs_dir: Path | str) -> list[RunInfo]:
    """Every run under ``runs_dir``, oldest first; directories that are not runs are skipped."""
    root = Path(runs_dir)
    if not root.exists():
        return []  # no run yet
    if not root.is_dir():
        raise StoreError(f"runs directory '{root}' is not a directory")
    return [_run_info(p) for p in sorted(root.iterdir()) if is_run_dir(p)]


def resolve_run(runs_dir: Path | str, ref: str | Path) -> Path:
    """Find a run from a path, a directory name, or a unique prefix/suffix of its name."""
    root, text = Path(runs_dir), str(ref)
    if not text:
        raise StoreError("empty run reference; give a run directory or part of its name")
    for direct in (Path(ref), root / text):
        if is_run_dir(direct):
            return direct
    runs = _runs_in(root)
    found = [
        p
        for p in runs
        if p.name.startswith(text) or p.name.endswith(text) or config_name(p).startswith(text)
    ]
    exact = [p for p in found if config_name(p) == text]  # 'sig' is not also 'sig2'
    if exact and len(exact) < len(found):
        found = exact
    if len(found) == 1:
        return found[0]
    if found:
        raise StoreError(
            f"run reference '{text}' is ambiguous: it matches {len(found)} runs in '{root}': "
            + ", ".join(p.name for p in found)
        )
    if Path(ref).is_dir():
        raise StoreError(f"'{text}' is a directory but not a run: it holds no {DB_NAME}")
    known = ", ".join(p.name for p in runs[-10:]) or "(none)"
    raise StoreError(f"no run matches '{text}' in '{root}'; runs there: {known}")


def _runs_in(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if is_run_dir(p)) if root.is_dir() else []


def resolve_runs(runs_dir: Path | str, refs: Sequence[str]) -> list[Path]:
    """Several runs, in the order named, each once: each reference is a run as
    :func:`resolve_run` finds it, a glob pattern (``'sweep-*'``: over the folder
    names in ``runs_dir`` and their config names, and as a path), or a folder
    holding runs (a sweep's runs directory: every run in it). A pattern or a
    folder that finds no run is refused, as is a reference that names none."""
    root = Path(runs_dir)
    found: list[Path] = []
    seen: set[Path] = set()  # resolved: a run reached by two paths is one run
    for ref in refs:
        if any(ch in ref for ch in "*?["):
            paths = {Path(p) for p in glob.glob(ref)} | {
                p
                for p in _runs_in(root)
                if fnmatch.fnmatchcase(p.name, ref) or fnmatch.fnmatchcase(config_name(p), ref)
            }
            matched = sorted(p for p in paths if is_run_dir(p))
            if not matched:
                raise StoreError(f"no run matches the pattern '{ref}' (in '{root}' or as a path)")
        elif ref and Path(ref).is_dir() and not is_run_dir(Path(ref)):
            matched = _runs_in(Path(ref))
            if not matched:
                raise StoreError(f"'{ref}' is a directory but holds no run (no {DB_NAME} in it)")
        else:
            matched = [resolve_run(root, ref)]
        for path in matched:
            if path.resolve() not in seen:
                seen.add(path.resolve())
                found.append(path)
    return found

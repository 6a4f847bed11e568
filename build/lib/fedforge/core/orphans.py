"""Working files named after the process that made them (``<prefix><pid>-...``),
and the sweep that deletes those of processes that no longer exist: a process
killed with SIGKILL never reaches the code that would remove its own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_orphans(folder: Path, prefix: str) -> None:
    """Delete the files and directories ``<prefix><pid>-*`` in ``folder`` whose
    process is gone."""
    for path in folder.glob(f"{prefix}*-*"):
        owner = path.name[len(prefix) :].split("-", 1)[0]
        if not owner.isdigit() or pid_alive(int(owner)):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def remove_if_owner(path: Path, owner_pid: int) -> None:
    """Delete the directory ``path`` when called in the process that made it (a
    forked child's exit must not remove its parent's working files)."""
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)

"""A deployment server's live state, published as a JSON file in its run folder.

The server (``transport/live.py``) rewrites ``live.json`` when its state changes
(a client joins, the round moves to another phase, an upload is refused); the
dashboard (``report/dashboard``) reads it. The file is replaced atomically (a
temporary file beside it, then ``os.replace``), so a reader sees either the old
state or the new one, never half of one. A reader tolerates an absent,
truncated or garbled file (a copy made with other tools, a full disk): it gets
None and tries again later.

What the server writes (every key may be missing in a file of another version):
``updated`` (unix time of the write), ``serving`` (false once the server
stopped), ``pid``, ``address``, ``phase`` (what the round thread awaits),
``num_clients``, ``joined`` and ``connected`` (client ids; connected: heard from
within the heartbeat timeout), ``accepted`` (answers taken), ``dropouts``
(questions left unanswered when their round closed on its deadline or on the
silence of the clients that owed them), ``refused`` (reason kind -> count),
``bytes_up`` and ``bytes_down`` (training payload bytes on the wire).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

LIVE_NAME = "live.json"
LIVE_VERSION = 1
# a state older than this, from a server that did not say it stopped, is stale: a
# killed server says nothing (it refreshes the file every few seconds while it
# serves); the dashboard judges it by this
STALE_AFTER_S = 10.0


def live_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / LIVE_NAME


def write_live_state(run_dir: Path | str, state: dict[str, Any]) -> None:
    """Replace the run's live-state file with ``state`` (JSON-able; non-finite
    floats are written as null). OSError when the folder cannot be written."""
    path = live_path(run_dir)
    clean = {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in state.items()
    }
    text = json.dumps({"version": LIVE_VERSION, **clean}, sort_keys=True)
    fd, tmp = tempfile.mkstemp(prefix=".live-", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # readable by a dashboard run as another user
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: past a float
        raise ValueError(f"{text} is not a finite number")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's extension


def read_live_state(run_dir: Path | str) -> dict[str, Any] | None:
    """The run's published live state, or None when there is none (no deployment
    server ran it) or it cannot be read whole. Strict JSON: a file holding NaN or
    an infinity (never written by :func:`write_live_state`) reads as none."""
    try:
        text = live_path(run_dir).read_text()
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # nested past the stack
        return None
    return value if isinstance(value, dict) else None


__all__ = [
    "LIVE_NAME",
    "STALE_AFTER_S",
    "live_path",
    "read_live_state",
    "write_live_state",
]

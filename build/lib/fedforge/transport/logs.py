"""Structured logs of the deployment: one JSON object per line on stderr, so a
log collector can read them and a person can grep them."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def log_event(side: str, event: str, **fields: Any) -> None:
    """Write ``event`` of ``side`` (server, client) with its fields."""
    line = {"t": round(time.time(), 3), "side": side, "event": event, **fields}
    print(json.dumps(line, default=str), file=sys.stderr, flush=True)

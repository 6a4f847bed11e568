"""Structured logs of the deployment: one JSON object per line on stderr, so a
log collector can read them and a person can grep them.

A peer chooses some of what is logged (the name it claims, a reason quoting its
message): each text field is cut to a bound, names to :data:`NAME_CHARS`, so a
call costs a line of bounded size however much the peer sent."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

NAME_CHARS = 64  # a client name's longest (files.MAX_NAME_CHARS)
TEXT_CHARS = 1000
NAME_FIELDS = frozenset({"sender", "name", "owner"})
_WRITE = threading.Lock()


def clipped(text: str, most: int) -> str:
    """``text``, or its first ``most`` characters and how many more there were."""
    if len(text) <= most:
        return text
    return f"{text[:most]}...[{len(text) - most} more characters]"


def log_event(side: str, event: str, **fields: Any) -> None:
    """Write ``event`` of ``side`` (server, client) with its fields."""
    for key, value in fields.items():
        if isinstance(value, str):
            fields[key] = clipped(value, NAME_CHARS if key in NAME_FIELDS else TEXT_CHARS)
    line = {"t": round(time.time(), 3), "side": side, "event": event, **fields}
    text = json.dumps(line, default=str) + "\n"
    with _WRITE:  # one write a line: threads (a client's uploads) never interleave
        sys.stderr.write(text)
        sys.stderr.flush()


class _PeerGone(logging.Filter):
    """grpc.aio logs an error, with a traceback, for each message it could not
    send on a call that had ended under it: a client that cancelled a download
    midway (routine, and a peer cancelling calls in a loop would fill the log
    with them), or a connection lost. Such lines are kept at debug level, for
    whoever turns grpc's logging up."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "ExecuteBatchError" in record.getMessage():
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_peer_gone() -> None:
    """Keep grpc's error lines for messages to ended calls at debug level (once)."""
    logger = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, _PeerGone) for f in logger.filters):
        logger.addFilter(_PeerGone())

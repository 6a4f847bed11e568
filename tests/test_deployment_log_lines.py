"""The deployment's structured log: one JSON object a line even when threads (a
client's uploads awaiting their verdicts) write at once."""

from __future__ import annotations

import json
import subprocess
import sys

WRITERS = """
import threading
from fedforge.transport.logs import log_event

start = threading.Barrier(8)


def write(k):
    start.wait()
    for i in range(300):
        log_event("client", "upload_accepted", client=k, round=i, reason="x" * (k * 50))


threads = [threading.Thread(target=write, args=(k,)) for k in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_threads_writing_at_once_give_one_event_a_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WRITERS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    events = [json.loads(line) for line in lines]  # each line one whole object
    assert len(events) == 8 * 300
    assert sorted((e["client"], e["round"]) for e in events) == [
        (k, i) for k in range(8) for i in range(300)
    ]

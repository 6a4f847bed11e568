"""The dashboard's live feeds open at once are bounded (report/dashboard/watch.py,
``Feeds``): on a real uvicorn server in this process with the bound at 2, two
feeds stream, a third is told why in a ``failure`` event and ends, and a feed
closed by its reader frees its place."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

from fedforge.config import Config, override
from fedforge.report.dashboard.app import build_app
from fedforge.store import RoundRecord, RunStore
from test_dashboard_connections import serving

MOST = 2


def feed(port: int, run: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request("GET", f"/api/runs/{run}/events")
    return conn, conn.getresponse()


def first_event(answer: http.client.HTTPResponse) -> tuple[str, Any]:
    """The feed's first event: its name and data."""
    name = ""
    while True:
        line = answer.readline().decode().rstrip("\n")
        assert line or not answer.isclosed(), "the feed ended without an event"
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            return name, json.loads(line[6:])


def test_feeds_past_the_bound_are_told_why_and_a_closed_one_frees_its_place(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    with RunStore.create(root, override(Config(), {"name": "feeds", "rounds": 1})) as store:
        store.record_round(RoundRecord(0, 3, 1.0, 0.5, 1.0, 1000, 900, 0, 0.1, 0.5), [], [])
        store.finish({})
    run = store.path.name
    with serving(build_app(root, max_feeds=MOST)) as port:
        open_feeds = [feed(port, run) for _ in range(MOST)]
        for _, answer in open_feeds:
            assert answer.status == 200
            assert first_event(answer)[0] == "rounds"
        conn, answer = feed(port, run)
        assert first_event(answer) == (
            "failure",
            {"error": f"the dashboard has {MOST} live feeds open already; reload the page later"},
        )
        assert answer.read() == b"\n"  # the event's last line, and the end
        conn.close()
        for part in open_feeds[0]:  # its reader leaves: noticed at the feed's next poll
            part.close()
        end = time.monotonic() + 10
        while True:
            conn, answer = feed(port, run)
            name, _ = first_event(answer)
            conn.close()
            if name == "rounds":
                break
            assert time.monotonic() < end, "the closed feed's place was not freed"
            time.sleep(0.2)
        for c, a in open_feeds[1:]:
            a.close()
            c.close()

"""Alerts in a real run: one client of four sends NaN every round (refused), so
``refused_rate`` 0.25 fires after round 1 and ``client_refused`` 2 after round 2,
each once. A real command writes the JSON it gets on stdin (and its
FEDFORGE_ALERT_* variables) to a file; a real HTTP server on 127.0.0.1 receives
the POST; both equal the alert the store holds. A failing command, a command
past its timeout and an unreachable URL are recorded as failed and the run
still finishes. ``fedforge alerts RUN`` prints the recorded alerts."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MakeData, RunStopped
from tests.test_robust_gates import tiny

from deploy_sim import free_port
from fedforge.alerts import alert_payload
from fedforge.cli import main
from fedforge.config import Config, override
from fedforge.server import loop
from fedforge.server.loop import run
from fedforge.store import RunStore

pytestmark = pytest.mark.usefixtures("one_thread")

# the alert's stdin and FEDFORGE_ALERT_* variables, to <dir>/<rule>-<round>.json
WRITER = """\
import json, os, sys
payload = sys.stdin.read()
env = {k: v for k, v in os.environ.items() if k.startswith("FEDFORGE_ALERT_")}
name = f"{env['FEDFORGE_ALERT_RULE']}-{env['FEDFORGE_ALERT_ROUND']}.json"
with open(os.path.join(sys.argv[1], name), "w") as f:
    json.dump({"stdin": payload, "env": env}, f)
"""


class _Received(BaseHTTPRequestHandler):
    bodies: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        size = int(self.headers["Content-Length"])
        self.bodies.append((self.path, self.headers["Content-Type"], self.rfile.read(size)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    """A real HTTP server on a free port of 127.0.0.1: its URL and what it received."""
    _Received.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Received)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Received.bodies
    finally:
        server.shutdown()
        server.server_close()


def _config(tmp_path: Path, url: str, out: Path) -> Config:
    fail = "import sys; sys.stderr.write('no pager today\\n'); sys.exit(3)"
    rules = [
        {"kind": "refused_rate", "threshold": 0.25, "url": url + "/hook"},
        {"kind": "client_refused", "threshold": 2,
         "command": [sys.executable, "-c", WRITER, str(out)]},
        {"name": "failing", "kind": "refused_rate", "threshold": 0.2,
         "command": [sys.executable, "-c", fail]},
        {"name": "slow", "kind": "refused_rate", "threshold": 0.1, "timeout": 0.5,
         "command": [sys.executable, "-c", "import time; time.sleep(30)"]},
        {"name": "nobody", "kind": "refused_rate", "threshold": 0.05,
         "url": f"http://127.0.0.1:{free_port()}/"},
    ]  # fmt: skip
    cfg = tiny(4, rounds=3, tmp=tmp_path / "runs", attack="nan_inf", attack_fraction=0.25)
    return override(cfg, {"alerts.rules": rules})


def test_a_real_run_acts_on_its_alerts_and_records_them(
    make_data: MakeData,
    tmp_path: Path,
    http_server: tuple[str, list[tuple[str, str, bytes]]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, received = http_server
    out = tmp_path / "out"
    out.mkdir()
    start = time.perf_counter()
    result = run(_config(tmp_path, url, out), data=make_data([6, 5, 7, 6]))
    took = time.perf_counter() - start
    assert result.run_dir is not None and len(result.rounds) == 3
    assert took < 20  # the slow command was killed after 0.5 s, not waited for
    with RunStore.open(result.run_dir, read_only=True) as store:
        assert store.status == "finished"
        alerts = store.alerts()
        refused = store.anomalies()
    attacker = {a.client_id for a in refused}
    assert len(attacker) == 1 and [a.round_idx for a in refused] == [0, 1, 2]
    (client,) = attacker
    fired = [(a.round_idx, a.rule, a.client_id) for a in alerts]
    assert fired == [
        (0, "refused_rate", None),
        (0, "failing", None),
        (0, "slow", None),
        (0, "nobody", None),
        (1, "client_refused", client),
    ]
    by = {a.rule: a for a in alerts}
    assert by["refused_rate"].value == 0.25 and by["refused_rate"].outcome == "url: HTTP 204"
    assert by["failing"].outcome == "command failed: exit status 3: no pager today"
    assert by["slow"].outcome == "command failed: no exit within 0.5 s (killed)"
    assert by["nobody"].outcome.startswith("url failed: ")
    assert by["client_refused"].outcome == "command: ok"

    written = json.loads((out / "client_refused-2.json").read_text())
    stored = alert_payload(by["client_refused"], result.run_dir)
    assert json.loads(written["stdin"]) == stored
    assert stored["client"] == client and stored["round"] == 2 and stored["value"] == 2.0
    assert written["env"]["FEDFORGE_ALERT_CLIENT"] == str(client)
    assert written["env"]["FEDFORGE_ALERT_MESSAGE"] == by["client_refused"].message
    assert sorted(p.name for p in out.iterdir()) == ["client_refused-2.json"]

    assert [(path, kind) for path, kind, _ in received] == [("/hook", "application/json")]
    assert json.loads(received[0][2]) == alert_payload(by["refused_rate"], result.run_dir)

    err = capsys.readouterr().err
    assert "alert 'client_refused' after round 2: client" in err
    assert "alert 'failing': command failed: exit status 3" in err

    assert main(["alerts", str(result.run_dir)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ROUND", "RULE", "KIND", "MESSAGE", "OUTCOME"]
    assert len(table) == 1 + len(alerts)
    assert table[5].startswith("2 ") and "client_refused" in table[5]
    assert table[5].rstrip().endswith("command: ok")


def test_a_resumed_run_fires_as_the_uninterrupted_one(
    make_data: MakeData, tmp_path: Path, run_stopped: RunStopped
) -> None:
    """``refused_rate`` fires after round 1 and holds: a resume after round 3
    rebuilds that from the store and does not fire it again; ``client_refused``
    fires once, as it did in the run never stopped."""
    rules = [
        {"kind": "refused_rate", "threshold": 0.25},
        {"kind": "client_refused", "threshold": 2},
    ]
    cfg = tiny(4, rounds=5, tmp=tmp_path / "a", attack="nan_inf", attack_fraction=0.25)
    cfg = override(cfg, {"alerts.rules": rules, "checkpoint_every": 1})
    data = make_data([6, 5, 7, 6])
    whole = run(cfg, data=data)
    stopped = run_stopped(override(cfg, {"runs_dir": str(tmp_path / "b")}), data, 2)
    assert stopped.stopped == "SIGTERM" and len(stopped.rounds) == 3
    resumed = loop.resume(stopped.run_dir, data=data)
    assert len(resumed.rounds) == 5

    def fired(run_dir: Path | None) -> list[tuple[int, str, int | None, str]]:
        assert run_dir is not None
        with RunStore.open(run_dir, read_only=True) as store:
            return [(a.round_idx, a.rule, a.client_id, a.message) for a in store.alerts()]

    assert [a[:2] for a in fired(whole.run_dir)] == [(0, "refused_rate"), (1, "client_refused")]
    assert fired(resumed.run_dir) == fired(whole.run_dir)


def test_a_skipped_round_rates_its_refusals_over_the_clients_asked(
    make_data: MakeData, tmp_path: Path
) -> None:
    """robust.min_clients 4 with one client of four sending NaN: every round is
    skipped (3 updates accepted) and stores no client row, yet 1 of the 4
    clients asked was refused: 0.25, so a 0.5 rule stays quiet and a 0.25 one
    fires once; ``client_refused`` 2 fires for the attacker after round 2."""
    rules = [
        {"name": "half", "kind": "refused_rate", "threshold": 0.5},
        {"name": "quarter", "kind": "refused_rate", "threshold": 0.25},
        {"kind": "client_refused", "threshold": 2},
    ]
    cfg = tiny(4, rounds=3, tmp=tmp_path, attack="nan_inf", attack_fraction=0.25, min_clients=4)
    result = run(override(cfg, {"alerts.rules": rules}), data=make_data([6, 5, 7, 6]))
    assert result.run_dir is not None
    with sqlite3.connect(result.run_dir / "store.sqlite") as conn:
        cohorts = conn.execute("SELECT cohort_size FROM rounds ORDER BY round_idx").fetchall()
        used = conn.execute("SELECT COUNT(*) FROM client_rounds").fetchone()[0]
        refused = conn.execute(
            "SELECT round_idx, client_id FROM anomalies WHERE client_id IS NOT NULL"
        ).fetchall()
        skips = conn.execute("SELECT COUNT(*) FROM anomalies WHERE client_id IS NULL").fetchone()
        alerts = conn.execute(
            "SELECT round_idx, rule, client_id, value, message FROM alerts ORDER BY rowid"
        ).fetchall()
    assert cohorts == [(4,), (4,), (4,)] and used == 0 and skips == (3,)
    ((_, attacker),) = {(0, c) for _, c in refused}
    assert sorted(refused) == [(r, attacker) for r in range(3)]
    assert alerts == [
        (0, "quarter", None, 0.25, "1 of 4 clients asked were refused (25.00%)"),
        (1, "client_refused", attacker, 2.0, alerts[1][4]),
    ]

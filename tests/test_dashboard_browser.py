"""``fedforge dashboard`` in a real browser: the system's Chromium, driven by
Playwright, against a dashboard started as its own process (with an access
token) over run stores written by the real RunStore. What the page shows is
checked against the store's rows read with plain sqlite3, and against the
live-state file the deployment server's own writer (a real hub and its
publisher) wrote, whose liveness the dashboard judges by its own clock (the
browser's is set an hour off); alerts recorded by the alert monitor appear as
they fire. The browser presents the token once in the address (then its
cookie); plain HTTP requests check that nothing is served without it."""

from __future__ import annotations

import datetime
import http.client
import json
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from fedforge.alerts.monitor import Monitor
from fedforge.config import Config, override
from fedforge.report.dashboard.process import DashboardProcess, start_dashboard
from fedforge.report.dashboard.watch import RunWatcher
from fedforge.server.state import RunLock
from fedforge.store import AnomalyRecord, RoundRecord, RunStore
from fedforge.store.live_state import LIVE_NAME, STALE_AFTER_S, write_live_state
from fedforge.transport.hub import Hub
from fedforge.transport.live import LivePublisher
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.work import UPDATE

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TOKEN = "k7Qx-9fVb2_Lm4Ns8PzR1wYt"
PLOTS = ("plot-accuracy", "plot-loss", "plot-bytes")


def _round(r: int, acc: float) -> RoundRecord:
    return RoundRecord(r, 3, 1.0 / (r + 1), acc, 2.0 / (r + 2), 1000 + r, 900 + 2 * r, 0, 0.1, 0.5)


@dataclass
class Runs:
    root: Path
    finished: Path
    running: RunStore  # open for writing, its lock held: a run in progress
    files: dict[str, bytes]  # the finished run's files as written


def _files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("dashboard") / "runs"
    with RunStore.create(root, override(Config(), {"name": "done", "rounds": 3})) as done:
        for r, acc in enumerate((0.25, 0.5, 0.625)):
            done.record_round(_round(r, acc), [])
        done.finish({"wall_seconds": 1.5})
    live = RunStore.create(root, override(Config(), {"name": "live", "rounds": 6}))
    lock = RunLock(live.path).acquire()
    for r, acc in enumerate((0.125, 0.375)):
        refused = [AnomalyRecord(r, 4, f"update norm {10 + r}.5 exceeds the bound 3.0")]
        live.record_round(_round(r, acc), [], refused)
    yield Runs(root, done.path, live, _files(done.path))
    lock.release()
    live.close()


@pytest.fixture(scope="module")
def dashboard(runs: Runs) -> Iterator[DashboardProcess]:
    log = runs.root.parent / "dashboard.log"
    with start_dashboard(runs.root, "--token", TOKEN, log=log) as dash:
        yield dash


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium binary on PATH (`make test` installs it with apt-get)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True)
        yield b
        b.close()


@dataclass
class Tab:
    page: Any
    url: str
    errors: list[str] = field(default_factory=list)

    def open(self, path: str) -> None:
        """Open ``path``, presenting the token in the address (the first time of
        this browser context: the cookie carries it from then on)."""
        self.page.goto(f"{self.url}{path}?token={TOKEN}")
        assert self.page.url == f"{self.url}{path}"  # redirected: not left in the address


@pytest.fixture
def tab(browser: Any, dashboard: DashboardProcess) -> Iterator[Tab]:
    """A fresh page whose console errors and uncaught exceptions are collected."""
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    tab = Tab(context.new_page(), dashboard.url)
    tab.page.on("console", lambda m: m.type == "error" and tab.errors.append(m.text))
    tab.page.on("pageerror", lambda exc: tab.errors.append(str(exc)))
    yield tab
    context.close()


def _store_rows(run_dir: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        return db.execute(
            "SELECT round_idx, train_loss, test_accuracy, test_loss, bytes_up, bytes_down "
            "FROM rounds ORDER BY round_idx"
        ).fetchall()


def _store_line(run_dir: Path) -> tuple[str, tuple[str, ...]]:
    """A run's id and (status, algorithm, sim, rounds done/planned, best accuracy),
    from sqlite3 (these runs are the simulator's)."""
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        run_id, status, config = db.execute("SELECT id, status, config_json FROM runs").fetchone()
        done, best = db.execute("SELECT COUNT(*), MAX(test_accuracy) FROM rounds").fetchone()
    cfg = json.loads(config)
    return run_id, (
        status,
        cfg["algorithm"],
        "sim",
        f"{done}/{cfg['rounds']}",
        f"acc {100 * best:.2f}%",
    )


def test_runs_page_lists_the_stores_runs(runs: Runs, tab: Tab) -> None:
    tab.open("")
    tab.page.wait_for_selector("#runs tbody tr")
    cells = tab.page.eval_on_selector_all(
        "#runs tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    shown = {row[0]: tuple(row[1:6]) for row in cells}
    assert shown == dict(_store_line(p) for p in (runs.finished, runs.running.path))
    link = tab.page.get_attribute(f"tr[data-run-id='{runs.running.path.name}'] a", "href")
    assert link == f"/runs/{runs.running.path.name}"
    assert tab.errors == []


def _plotted(tab: Tab) -> list[list[list[Any]]]:
    """Each plot's traces as [x, y], read from the plotly divs."""
    return tab.page.evaluate(
        "ids => ids.map(id => document.getElementById(id).data.map(t => [t.x, t.y]))", list(PLOTS)
    )


def test_run_page_curves_grow_when_a_round_is_committed(runs: Runs, tab: Tab) -> None:
    run = runs.running
    tab.open(f"runs/{run.path.name}")
    length = "n => document.getElementById('plot-accuracy').data?.[0]?.x?.length === n"
    before = len(_store_rows(run.path))
    tab.page.wait_for_function(length, arg=before, timeout=10_000)
    run.record_round(_round(before, 0.8125), [])
    committed = time.monotonic()
    tab.page.wait_for_function(length, arg=before + 1, timeout=5_000)
    assert time.monotonic() - committed < 3.0
    rows = _store_rows(run.path)
    rounds = [r[0] + 1 for r in rows]
    accuracy, loss, sent = _plotted(tab)
    assert accuracy == [[rounds, [r[2] for r in rows]]]
    assert loss == [[rounds, [r[1] for r in rows]], [rounds, [r[3] for r in rows]]]
    assert sent == [[rounds, [r[4] for r in rows]], [rounds, [r[5] for r in rows]]]
    tab.page.wait_for_function(
        "t => document.getElementById('progress').textContent.startsWith(t)",
        arg=f"rounds {len(rows)}/6",
    )
    assert tab.page.text_content("#status") == "running"
    # the store's refused updates, grouped by reason with the numbers as # (as the report does)
    assert tab.page.text_content("#anomaly-reasons td") == "update norm # exceeds the bound #"
    assert tab.errors == []


def test_deployment_panel_shows_the_servers_live_state(runs: Runs, tab: Tab) -> None:
    hub = Hub(num_clients=6, heartbeat_timeout_s=30.0)
    live = LivePublisher(hub, "127.0.0.1:50051", min_interval_s=0.05)
    hub.on_change = live.changed
    hub.on_refusal = lambda who, client, why: live.refused(why)
    live.start()
    live.bind(runs.running.path)
    hub.join("site-a", [(0, 10), (1, 12)])
    hub.join("site-b", [(9, 5)])  # outside the federation: refused
    hub.set_phase("round 4: training")
    hub.ask([pb.Work(kind=pb.Work.TRAIN, client_id=1, round_idx=3)], 3)
    assert list(hub.gather({(1, 3, UPDATE, "")}, deadline_s=0.0)) == []  # a dropout
    # the browser's clock an hour off: the dashboard's own clock judges the state
    tab.page.clock.set_fixed_time(datetime.datetime.now() + datetime.timedelta(hours=1))
    tab.open(f"runs/{runs.running.path.name}")
    tab.page.wait_for_selector("#deployment:not([hidden])")
    facts = "#dep-facts dd"
    tab.page.wait_for_function(
        "s => document.getElementById('dep-phase')?.textContent === s", arg="round 4: training"
    )
    assert tab.page.text_content("#dep-connected") == "2 of 6: 0-1"
    assert tab.page.text_content("#dep-away") == "4: 2-5"
    assert tab.page.text_content("#dep-dropouts") == "1"
    assert tab.page.text_content("#dep-state") == "live"
    age = tab.page.text_content("#dep-updated") or ""
    assert age.endswith(" s ago") and 0 <= float(age.split()[0]) < STALE_AFTER_S
    # the cells' text, not innerText: that depends on the row being laid out yet
    cells = "rs => rs.map(r => Array.from(r.cells, c => c.textContent).join('\\t'))"
    assert tab.page.eval_on_selector_all("#dep-refused tr", cells) == ["membership\t1"]
    assert len(tab.page.query_selector_all(facts)) >= 5
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    tab.page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    live.close("the run ended")  # the server's last word
    tab.page.wait_for_function(
        "() => document.getElementById('dep-state').textContent === 'stopped'", timeout=5_000
    )
    assert tab.page.text_content("#dep-phase") == "the run ended"
    # a server killed (it says nothing): serving, but not heard from for a minute
    write_live_state_at(runs.running.path, live.snapshot(), time.time() - 60)
    state_is = "s => document.getElementById('dep-state').textContent === s"
    tab.page.wait_for_function(state_is, arg="not heard from", timeout=5_000)
    # one gone silent now: live, then stale with no file written (judged again each second)
    path = write_live_state_at(runs.running.path, live.snapshot(), time.time() - STALE_AFTER_S + 3)
    tab.page.wait_for_function(state_is, arg="live", timeout=5_000)
    written = path.stat().st_mtime_ns
    tab.page.wait_for_function(state_is, arg="not heard from", timeout=6_000)
    assert path.stat().st_mtime_ns == written
    assert tab.errors == []


def write_live_state_at(run_dir: Path, state: dict[str, Any], updated: float) -> Path:
    """The live-state file as a server writes it, ``updated`` at the time given."""
    write_live_state(run_dir, {**state, "updated": updated})
    return run_dir / LIVE_NAME


def _get(url: str, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=20)
    conn.request("GET", path, headers=headers or {})
    return conn.getresponse()


def test_with_a_token_every_request_needs_it(runs: Runs, dashboard: DashboardProcess) -> None:
    run = runs.running.path.name
    for path in ("/", "/api/runs", f"/api/runs/{run}", f"/api/runs/{run}/events"):
        assert _get(dashboard.url, path).status == 401, path
        wrong = {"Authorization": "Bearer " + TOKEN[:-1] + "x"}
        assert _get(dashboard.url, path, wrong).status == 401, path
        assert _get(dashboard.url, path, {"Cookie": "fedforge_dashboard=x"}).status == 401, path
    assert _get(dashboard.url, "/static/plotly.min.js").status == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    answer = _get(dashboard.url, f"/api/runs/{run}", bearer)
    assert answer.status == 200
    detail = json.loads(answer.read())
    fields = ("train_loss", "test_accuracy", "test_loss", "bytes_up", "bytes_down")
    got = [(r["round"] - 1, *(r[k] for k in fields)) for r in detail["rounds"]]
    assert got == _store_rows(runs.running.path)
    # once with ?token=: redirected without it, with the token in a cookie
    once = _get(dashboard.url, f"/api/runs?token={TOKEN}")
    assert once.status == 303 and once.getheader("location") == "/api/runs"
    cookie = once.getheader("set-cookie") or ""
    port = urlsplit(dashboard.url).port
    assert cookie.startswith(f"fedforge_dashboard_{port}={TOKEN};") and "HttpOnly" in cookie
    listing = _get(dashboard.url, "/api/runs", {"Cookie": cookie.split(";")[0]})
    assert listing.status == 200
    ids = {r["run_id"] for r in json.loads(listing.read())["runs"]}
    assert ids == {runs.finished.name, run}
    # read-only: no method but GET (and HEAD) is routed, and a run read is a run unchanged
    where = urlsplit(dashboard.url)
    for method in ("POST", "PUT", "DELETE"):
        conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=20)
        conn.request(method, f"/api/runs/{run}", headers=bearer)
        assert conn.getresponse().status == 405, method
    assert _get(dashboard.url, f"/api/runs/{runs.finished.name}", bearer).status == 200
    after = _files(runs.finished)
    assert {k: after[k] for k in runs.files} == runs.files
    # besides, only what any SQLite reader of a WAL database makes (as `fedforge runs`
    # does): the shared-memory index, and an empty log
    assert set(after) - set(runs.files) <= {"store.sqlite-shm", "store.sqlite-wal"}
    assert after.get("store.sqlite-wal", b"") == b""


def _events(watcher: RunWatcher) -> dict[str, Any]:
    """The watcher's events since its last poll, by name (their JSON read back)."""
    out = {}
    for text in watcher.poll():
        name, data = (line.split(": ", 1)[1] for line in text.strip().splitlines())
        out[name] = json.loads(data)
    return out


def test_the_feed_sends_new_rows_and_all_of_them_after_a_rewind(tmp_path: Path) -> None:
    with RunStore.create(tmp_path, override(Config(), {"name": "feed", "rounds": 9})) as store:
        for r in range(3):
            store.record_round(_round(r, r / 8), [])
        watcher = RunWatcher(store.path)
        try:
            first = _events(watcher)
            assert first["rounds"]["reset"] is True
            assert [row["round"] for row in first["rounds"]["rows"]] == [1, 2, 3]
            assert first["status"]["rounds_done"] == 3 and first["live"] is None
            assert _events(watcher) == {}  # nothing changed: nothing sent
            store.record_round(_round(3, 0.5), [])
            store.record_round(_round(4, 0.75), [])
            grown = _events(watcher)["rounds"]
            assert grown["reset"] is False
            assert [(row["round"], row["test_accuracy"]) for row in grown["rows"]] == [
                (4, 0.5),
                (5, 0.75),
            ]
            store.rewind(2)  # a resume: rounds 3.. again, round 3 now different
            store.record_round(_round(2, 0.9375), [])
            store.record_round(_round(3, 0.25), [])
            again = _events(watcher)["rounds"]
            assert again["reset"] is True
            assert [row["test_accuracy"] for row in again["rows"]] == [0, 0.125, 0.9375, 0.25]
        finally:
            watcher.close()


def _store_alerts(run_dir: Path) -> list[list[str]]:
    """The alerts table as the page should list it: round (from 1), rule, message,
    outcome, read with sqlite3."""
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        rows = db.execute(
            "SELECT round_idx, rule, message, outcome FROM alerts ORDER BY round_idx, rowid"
        ).fetchall()
    return [[str(r + 1), rule, message, outcome] for r, rule, message, outcome in rows]


def test_run_page_lists_the_alerts_as_they_fire(runs: Runs, tab: Tab) -> None:
    run = runs.running
    rules = [
        {"kind": "accuracy_drop", "threshold": 5, "name": "drop-5"},
        {"kind": "accuracy_drop", "threshold": 30, "name": "drop-30"},
    ]
    monitor = Monitor(override(Config(), {"alerts": {"rules": rules}}), say=lambda line: None)
    tab.open(f"runs/{run.path.name}")
    total = "t => document.getElementById('alert-total').textContent === t"
    tab.page.wait_for_function(total, arg="0 alerts fired")
    assert tab.page.is_hidden("#alert-rows")
    shown = "n => document.querySelectorAll('#alert-rows tbody tr').length === n"
    best = max(r[2] for r in _store_rows(run.path))
    for drop in (0.1, 0.35):  # points below the best: past 5, then past 30 too
        first = len(_store_rows(run.path))
        run.record_round(_round(first, best - drop), [])
        fired = monitor.after_round(run, first)  # recorded after the round, as the loop does
        assert [a.round_idx for a in fired] == [first]
        expected = _store_alerts(run.path)
        tab.page.wait_for_function(shown, arg=len(expected), timeout=5_000)
        cells = tab.page.eval_on_selector_all(
            "#alert-rows tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
        )
        assert cells == expected
    assert [row[1] for row in expected] == ["drop-5", "drop-30"]
    assert tab.page.text_content("#alert-total") == "2 alerts fired"
    assert tab.errors == []

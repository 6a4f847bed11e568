"""``fedforge dashboard`` over plain HTTP: real dashboard processes (one without a
token on loopback, two with tokens) and requests a browser or an attacker's page
could send: another Host (DNS rebinding), odd run ids, a hand-made live-state
file, ``?token=`` visits at paths that would leave the origin, two dashboards'
cookies in one cookie jar, a websocket upgrade, and a feed that takes a while to
read while other requests wait. The refusal groups are compared with those of
the report (``fedforge report``) of the same run."""

from __future__ import annotations

import http.client
import http.cookiejar
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from tests.report_pages import read_page

from fedforge.cli import main
from fedforge.config import Config, override
from fedforge.report.dashboard import command
from fedforge.report.dashboard.auth import TOKEN_ENV, TokenGate, access_token, is_loopback
from fedforge.report.dashboard.process import DashboardProcess, start_dashboard
from fedforge.store import AnomalyRecord, RoundRecord, RunStore
from fedforge.store.live_state import LIVE_NAME

TOKEN = "Hq3-Zr8_vN2wLx5Pc7Tb9KdE"
OTHER_TOKEN = "Wm4_Ys6-Jf1Qa8Rn3Vu0GhTz"
HEAVY_REFUSALS = 200_000  # a first read of about a second


def _round(r: int) -> RoundRecord:
    return RoundRecord(r, 3, 1.0, 0.5, 1.0, 1000, 900, 0, 0.1, 0.5)


@dataclass
class Runs:
    root: Path
    plain: str  # two rounds, refusals of three reasons
    heavy: str  # one round, HEAVY_REFUSALS refusals


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("dash-http") / "runs"
    with RunStore.create(root, override(Config(), {"name": "plain", "rounds": 2})) as plain:
        reasons = (
            "update of client 3 has float32 dtype",
            "update norm 12.5 exceeds the bound 3.0",
            "update of client 12 has float32 dtype",
        )
        for r in range(2):
            refused = [AnomalyRecord(r, 10 * r + k, why) for k, why in enumerate(reasons)]
            plain.record_round(_round(r), [], refused)
        plain.finish({})
    with RunStore.create(root, override(Config(), {"name": "heavy", "rounds": 1})) as heavy:
        why = "update norm {}.5 is too large"
        many = [AnomalyRecord(0, c, why.format(c)) for c in range(HEAVY_REFUSALS)]
        heavy.record_round(_round(0), [], many)
        heavy.finish({})
    return Runs(root, plain.path.name, heavy.path.name)


@pytest.fixture(scope="module")
def open_dash(runs: Runs) -> Iterator[DashboardProcess]:
    """A dashboard on loopback without a token: anyone on this machine reads it."""
    with start_dashboard(runs.root, log=runs.root.parent / "open.log") as dash:
        yield dash


@pytest.fixture(scope="module")
def token_dash(runs: Runs) -> Iterator[DashboardProcess]:
    log = runs.root.parent / "token.log"
    args = ("--token", TOKEN, "--allow-host", "dash.example.org")
    with start_dashboard(runs.root, *args, log=log) as dash:
        yield dash


def _port(dash: DashboardProcess) -> int:
    return urlsplit(dash.url).port or 0


def _get(
    dash: DashboardProcess, path: str, headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", _port(dash), timeout=30)
    conn.request("GET", path, headers=headers or {})
    return conn.getresponse()


def _strict_json(text: str | bytes) -> Any:
    """JSON as a browser's JSON.parse reads it: NaN and Infinity are errors."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _first_events(answer: http.client.HTTPResponse, names: set[str]) -> dict[str, Any]:
    """Read the feed until each of ``names`` came once: {name: its data}."""
    got: dict[str, Any] = {}
    name = ""
    while not names <= set(got):
        line = answer.readline().decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            got.setdefault(name, _strict_json(line[6:]))
    return got


def test_a_request_naming_another_host_gets_400(
    runs: Runs, open_dash: DashboardProcess, token_dash: DashboardProcess
) -> None:
    port = _port(open_dash)
    paths = ("/", "/api/runs", f"/runs/{runs.plain}", f"/api/runs/{runs.plain}", "/static/run.js")
    for path in paths:
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io", "a@b"):
            answer = _get(open_dash, path, {"Host": host})
            assert answer.status == 400, (path, host)
            assert b"127.0.0.1, localhost, [::1]" in answer.read()
        for host in (f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", f"[::1]:{port}"):
            assert _get(open_dash, path, {"Host": host}).status == 200, (path, host)
    # --allow-host adds a name; the token is still needed under it
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert _get(token_dash, "/api/runs", {"Host": "dash.example.org:80", **bearer}).status == 200
    assert _get(token_dash, "/api/runs", {"Host": "dash.example.org"}).status == 401
    assert _get(token_dash, "/api/runs", {"Host": "other.example.org", **bearer}).status == 400


def test_an_allowed_host_that_is_no_host_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(command, "listen", _never_listen)
    argv = ["dashboard", "--runs-dir", str(tmp_path), "--allow-host", "a b/c"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-host 'a b/c' is not a host" in err


def _never_listen(*args: object) -> None:  # a safety net: the checks come before it
    raise AssertionError("the dashboard went on to listen")


def test_off_loopback_the_dashboard_refuses_to_start_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setattr(command, "listen", _never_listen)
    argv = ["dashboard", "--runs-dir", str(tmp_path), "--port", "0"]
    for host in ("0.0.0.0", "192.168.1.7", "::", "example.org"):
        assert main([*argv, "--host", host]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1
        assert f"--host {host} is not a loopback address" in err and TOKEN_ENV in err
    assert main([*argv, "--host", "0.0.0.0", "--token", "short"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err


def test_the_token_comes_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost")] == [
        True
    ] * 5
    assert access_token("127.0.0.1", None) is None
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert access_token("0.0.0.0", None) == TOKEN
    assert access_token("0.0.0.0", TOKEN[::-1]) == TOKEN[::-1]


def test_odd_run_ids_get_404(open_dash: DashboardProcess) -> None:
    for run_id in ("x" * 5000, "%00", "a%00b", "..", "%2E%2E"):
        for path in (f"/runs/{run_id}", f"/api/runs/{run_id}", f"/api/runs/{run_id}/events"):
            answer = _get(open_dash, path)
            assert answer.status == 404, path[:40]
            if path.startswith("/api/"):
                assert "no run named" in _strict_json(answer.read())["error"]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_live_state_that_is_not_json_reads_as_none(
    runs: Runs, open_dash: DashboardProcess, number: str
) -> None:
    live = runs.root / runs.plain / LIVE_NAME
    live.write_text(f'{{"version": 1, "serving": true, "updated": {number}, "phase": "x"}}')
    try:
        answer = _get(open_dash, f"/api/runs/{runs.plain}")
        assert answer.status == 200
        assert _strict_json(answer.read())["live"] is None
        feed = _get(open_dash, f"/api/runs/{runs.plain}/events")
        assert _first_events(feed, {"live"})["live"] is None
        feed.close()
        # the same file, with a number: read, and judged live by the dashboard's clock
        live.write_text(f'{{"version": 1, "serving": true, "updated": {time.time()}}}')
        shown = _strict_json(_get(open_dash, f"/api/runs/{runs.plain}").read())["live"]
        assert shown["condition"] == "live" and 0 <= shown["age_s"] < 5
    finally:
        live.unlink()


def test_a_token_visit_is_redirected_within_this_origin(token_dash: DashboardProcess) -> None:
    port = _port(token_dash)
    cases = {
        "//evil.example/": "/",  # a protocol-relative address: another host
        "/\\evil.example/": "/",  # read as // by browsers
        "/%0d%0a": "/%0d%0a",  # as spelled: no header split, no 500
        "/runs/a%2Fb": "/runs/a%2Fb",  # an encoded slash stays one
        "/api/runs": "/api/runs",
    }
    for path, where in cases.items():
        answer = _get(token_dash, f"{path}?token={TOKEN}")
        assert answer.status == 303, path
        assert answer.getheader("location") == where, path
        cookie = answer.getheader("set-cookie") or ""
        assert cookie.startswith(f"fedforge_dashboard_{port}={TOKEN}; Path=/;"), cookie
    answer = _get(token_dash, f"/api/runs?a=1&token={TOKEN}&b=%0A")
    assert answer.getheader("location") == "/api/runs?a=1&b=%0A"


def test_two_dashboards_on_one_host_keep_their_own_cookies(
    runs: Runs, token_dash: DashboardProcess
) -> None:
    jar = http.cookiejar.CookieJar()  # cookies by host, not port, as browsers keep them
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    log = runs.root.parent / "second.log"
    with start_dashboard(runs.root, "--token", OTHER_TOKEN, log=log) as second:
        assert browser.open(f"{token_dash.url}api/runs?token={TOKEN}").status == 200
        assert browser.open(f"{second.url}api/runs?token={OTHER_TOKEN}").status == 200
        assert len(jar) == 2
        for dash in (token_dash, second, token_dash):
            answer = browser.open(f"{dash.url}api/runs")  # by its cookie alone
            assert answer.status == 200 and answer.url == f"{dash.url}api/runs"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{second.url}api/runs")  # no cookie: refused
        assert refused.value.code == 401


def test_a_websocket_is_refused(token_dash: DashboardProcess) -> None:
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    assert _get(token_dash, "/", upgrade).status == 401  # never 101
    assert _get(token_dash, "/", {**upgrade, "Authorization": f"Bearer {TOKEN}"}).status != 101
    # the gate itself, given a websocket scope (a server with a websocket library):
    # closed before the app is reached, whatever the token; a lifespan passes
    reached: list[str] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    import asyncio

    gate = TokenGate(app, TOKEN)
    headers = [(b"authorization", f"Bearer {TOKEN}".encode())]
    asyncio.run(gate({"type": "websocket", "headers": headers, "path": "/"}, receive, send))
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]
    asyncio.run(gate({"type": "lifespan"}, receive, send))
    assert reached == ["lifespan"]


def test_a_long_feed_read_does_not_hold_up_other_requests(
    runs: Runs, open_dash: DashboardProcess
) -> None:
    feed = _get(open_dash, f"/api/runs/{runs.heavy}/events")
    assert feed.readline() == b"retry: 2000\n"  # the first poll starts now
    asked = time.monotonic()
    style = _get(open_dash, "/static/dashboard.css")
    assert style.status == 200 and style.read()
    answered = time.monotonic() - asked
    first = _first_events(feed, {"anomalies"})
    polled = time.monotonic() - asked
    feed.close()
    assert first["anomalies"]["refused"] == HEAVY_REFUSALS
    # the page's style came while the feed's first poll went on, not after it
    assert answered < polled / 2, (answered, polled)


def test_the_dashboard_groups_refusals_as_the_report_does(
    runs: Runs, open_dash: DashboardProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = _strict_json(_get(open_dash, f"/api/runs/{runs.plain}").read())["anomalies"]
    groups = {g["reason"]: g["count"] for g in shown["by_reason"]}
    assert groups == {  # by hand: two rounds of three refusals, two of them one rule
        "update of client # has float32 dtype": 4,
        "update norm # exceeds the bound #": 2,
    }
    out = runs.root.parent / "plain.html"
    assert main(["report", str(runs.root / runs.plain), "-o", str(out)]) == 0
    capsys.readouterr()
    reported = read_page(out).data["refused"]["by_reason"]
    assert dict(zip(reported["reason"], reported["count"], strict=True)) == groups
    assert not math.isnan(shown["refused"]) and shown["refused"] == 6

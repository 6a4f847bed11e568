"""The dashboard's web application (Starlette): two pages, their JSON, the live
feed, and the scripts they run. GET only: it reads run folders, never writes.

    /                          the runs (the ``fedforge runs`` table, refreshed)
    /runs/{run}                one run: its curves, live; its deployment server
    /api/runs                  the runs, as JSON
    /api/runs/{run}            one run's rounds, status, refusals, alerts, live state
    /api/runs/{run}/events     server-sent events as the run goes on (watch.py)
    /static/plotly.min.js      Plotly, from the installed ``plotly`` package
    /static/...                the pages' own scripts and style

Every response says what the browser may load (a Content-Security-Policy: this
origin's scripts only; the plots' inline styles), and is never framed. Requests
pass :class:`~fedforge.report.dashboard.auth.HostGate` (their Host names this
dashboard) and, with a token, :class:`~fedforge.report.dashboard.auth.TokenGate`.
"""

from __future__ import annotations

import functools
import html
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from fedforge.core.errors import StoreError
from fedforge.report.dashboard.auth import LOOPBACK_NAMES, HostGate, TokenGate
from fedforge.report.dashboard.data import find_run, run_detail, runs_listing
from fedforge.report.dashboard.watch import MAX_FEEDS, POLL_S, Feeds
from fedforge.report.runs import RUN_COLUMNS

STATIC = Path(__file__).with_name("static")
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        b"img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class SecurityHeaders:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def send_with(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with if scope["type"] == "http" else send)


@functools.cache
def plotly_js() -> bytes:
    """plotly.js as the installed Python package ships it (no CDN: works offline)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


def _page(title: str, body: str, scripts: list[str]) -> HTMLResponse:
    tags = "".join(f'<script defer src="/static/{s}"></script>' for s in scripts)
    return HTMLResponse(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{html.escape(title)}</title><link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="/static/dashboard.css">{tags}</head>'
        f"<body>{body}</body></html>"
    )


RUNS_BODY = """<header><h1>fedforge runs</h1><span class="where">{where}</span></header>
<main id="runs-page"><table id="runs"><thead><tr>{heads}</tr></thead><tbody></tbody></table>
<p id="no-runs" hidden>No runs yet in {where}.</p><p id="error" class="error" hidden></p></main>"""

RUN_BODY = """<header><a href="/">&larr; runs</a><h1>{run}</h1>
<span id="status" class="status"></span><span id="progress"></span></header>
<main id="run-page" data-run-id="{run}">
<section class="plots">
<div id="plot-accuracy" class="plot"></div><div id="plot-loss" class="plot"></div>
<div id="plot-bytes" class="plot"></div></section>
<section id="deployment" class="panel" hidden><h2>Deployment server
<span id="dep-state" class="status"></span></h2><dl id="dep-facts"></dl>
<h3>Refused by the server</h3><table id="dep-refused"><tbody></tbody></table></section>
<section id="anomalies" class="panel"><h2>Refused updates (run store)</h2>
<p id="anomaly-total"></p><table id="anomaly-reasons"><tbody></tbody></table></section>
<section id="alerts" class="panel"><h2>Alerts</h2><p id="alert-total"></p>
<table id="alert-rows"><thead><tr><th>round</th><th>rule</th><th>message</th><th>outcome</th>
</tr></thead><tbody></tbody></table></section>
<details class="panel"><summary>fedforge show</summary><pre id="summary"></pre></details>
<p id="error" class="error" hidden></p></main>"""


def build_app(
    runs_dir: Path | str,
    token: str | None = None,
    poll_s: float = POLL_S,
    hosts: tuple[str, ...] = (),
    max_feeds: int = MAX_FEEDS,
) -> Any:
    """The dashboard over the runs in ``runs_dir``; ``token``: required of every
    request; ``hosts``: the names it answers to besides the loopback ones;
    ``max_feeds``: the live feeds open at once."""
    root = Path(runs_dir)
    feeds = Feeds(max_feeds)

    def run_path(request: Request) -> Path | None:
        return find_run(root, request.path_params["run_id"])

    async def runs_page(request: Request) -> Response:
        heads = "".join(f"<th>{h}</th>" for h in RUN_COLUMNS)
        body = RUNS_BODY.format(where=html.escape(str(root.resolve())), heads=heads)
        return _page("fedforge runs", body, ["runs.js"])

    async def run_page(request: Request) -> Response:
        path = run_path(request)
        if path is None:
            return _not_found(request.path_params["run_id"])
        body = RUN_BODY.format(run=html.escape(path.name))
        return _page(f"{path.name} - fedforge", body, ["plotly.min.js", "run.js"])

    async def runs_json(request: Request) -> Response:
        try:
            return JSONResponse(await run_in_threadpool(runs_listing, root))
        except StoreError as exc:
            return JSONResponse({"error": str(exc)}, status_code=500)

    async def run_json(request: Request) -> Response:
        path = run_path(request)
        if path is None:
            return _not_found(request.path_params["run_id"], json=True)
        try:
            return JSONResponse(await run_in_threadpool(run_detail, path))
        except StoreError as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)

    async def run_feed(request: Request) -> Response:
        path = run_path(request)
        if path is None:
            return _not_found(request.path_params["run_id"], json=True)
        return StreamingResponse(
            feeds.events(path, request.is_disconnected, poll_s),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def plotly(request: Request) -> Response:
        return Response(
            plotly_js(),
            media_type="text/javascript",
            headers={"cache-control": "public, max-age=86400"},
        )

    routes = [
        Route("/", runs_page, methods=["GET"]),
        Route("/runs/{run_id}", run_page, methods=["GET"]),
        Route("/api/runs", runs_json, methods=["GET"]),
        Route("/api/runs/{run_id}", run_json, methods=["GET"]),
        Route("/api/runs/{run_id}/events", run_feed, methods=["GET"]),
        Route("/static/plotly.min.js", plotly, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    names = (*LOOPBACK_NAMES, *hosts)
    middleware = [Middleware(SecurityHeaders), Middleware(HostGate, names=names)]
    if token is not None:
        middleware.append(Middleware(TokenGate, token=token))
    return Starlette(routes=routes, middleware=middleware)


def _not_found(run_id: str, json: bool = False) -> Response:
    text = f"no run named '{run_id}' here"
    if json:
        return JSONResponse({"error": text}, status_code=404)
    return HTMLResponse(
        f'<!doctype html><title>not found</title><p>{html.escape(text)}. <a href="/">runs</a>',
        status_code=404,
    )


__all__ = ["build_app", "plotly_js"]

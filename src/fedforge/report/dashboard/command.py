"""``fedforge dashboard``: serve the dashboard over a runs directory (uvicorn).

fedforge dashboard [--runs-dir runs] [--port 8765] [--host 127.0.0.1] [--token T]
                   [--allow-host NAME ...] [--certs DIR]

Off loopback it needs an access token and HTTPS (``--certs DIR``: ``server.pem``
and ``server.key`` there, e.g. a federation's folder from ``fedforge certs``):
over plain HTTP anyone on the path would read the token.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
from pathlib import Path

from fedforge.core.errors import ConfigError
from fedforge.report.dashboard.auth import TOKEN_ENV, access_token, admitted_name, is_loopback

DEFAULT_PORT = 8765
# open live feeds end when the server stops: the browser reconnects to the next one
GRACEFUL_SHUTDOWN_S = 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``dashboard`` subcommand's arguments."""
    p = sub.add_parser("dashboard", help="a live web dashboard of the runs (read-only)")
    p.add_argument("--runs-dir", default="runs", help="the runs to show (default: runs)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any free one"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; any other needs a token)",
    )
    p.add_argument(
        "--token",
        help=f"access token every request must carry (else ${TOKEN_ENV}); required off loopback",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name or address browsers reach it by, besides 127.0.0.1, localhost, [::1] "
        "and --host (repeatable); requests naming any other Host get 400",
    )
    p.add_argument(
        "--certs",
        type=Path,
        metavar="DIR",
        help="serve HTTPS with DIR/server.pem and DIR/server.key (e.g. the federation's "
        "folder from `fedforge certs --hosts NAME`); required off loopback",
    )


def listen(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: any free one), or ConfigError saying why not."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port} is invalid: a port is 0..65535 (0: any free one)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host.strip("[]"), port), family=family)
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({why})") from None


def tls_files(host: str, certs: Path | None) -> tuple[str, str] | None:
    """The certificate and key to serve HTTPS with (None: plain HTTP, on loopback
    only); ConfigError off loopback without them, or for a file that is missing."""
    if certs is None:
        if not is_loopback(host):
            raise ConfigError(
                f"--host {host} is not a loopback address: over plain HTTP the access token "
                "crosses the network readable; serve HTTPS with --certs DIR (server.pem and "
                "server.key, e.g. from `fedforge certs`), or listen on 127.0.0.1"
            )
        return None
    pair = (certs / "server.pem", certs / "server.key")
    for path in pair:
        if not path.is_file():
            raise ConfigError(
                f"--certs {certs}: '{path}' does not exist (`fedforge certs` makes it)"
            )
    return str(pair[0]), str(pair[1])


def _unspecified(host: str) -> bool:
    """A wildcard address (0.0.0.0, ::): every interface, named by none."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; ConfigError for a bad argument (before listening)."""
    import uvicorn

    from fedforge.report.dashboard.app import build_app
    from fedforge.report.dashboard.connections import bounded_protocol

    token = access_token(args.host, args.token)
    tls = tls_files(args.host, args.certs)
    hosts = (args.host, *args.allow_host)
    bad = [h for h in args.allow_host if admitted_name(h) is None]
    if bad:
        raise ConfigError(
            f"--allow-host '{bad[0]}' is not a host name or address (e.g. dash.example.org, "
            "192.168.1.7, [fd00::7])"
        )
    runs_dir = Path(args.runs_dir)
    if runs_dir.exists() and not runs_dir.is_dir():
        raise ConfigError(f"--runs-dir '{runs_dir}' is not a directory")
    sock = listen(args.host, args.port)
    port = sock.getsockname()[1]
    host = f"[{args.host.strip('[]')}]" if ":" in args.host else args.host
    print(
        f"fedforge dashboard: {runs_dir.resolve()} at http{'s' if tls else ''}://{host}:{port}/"
        + (" (open it once with ?token=TOKEN)" if token else ""),
        flush=True,
    )
    if _unspecified(args.host) and not args.allow_host:
        print(
            f"fedforge dashboard: it answers to 127.0.0.1, localhost and [::1] only: add "
            f"--allow-host NAME for the name or address browsers reach {host} by",
            flush=True,
        )
    config = uvicorn.Config(
        build_app(runs_dir, token, hosts=hosts),
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ws="none",  # no route takes a websocket: the upgrade is never made
        http=bounded_protocol(),  # headers due in time, connections per address bounded
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


__all__ = ["add_parser", "run"]

"""``fedforge dashboard``: serve the dashboard over a runs directory (uvicorn).

fedforge dashboard [--runs-dir runs] [--port 8765] [--host 127.0.0.1] [--token T]
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from fedforge.core.errors import ConfigError
from fedforge.report.dashboard.auth import TOKEN_ENV, access_token

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


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; ConfigError for a bad argument (before listening)."""
    import uvicorn

    from fedforge.report.dashboard.app import build_app

    token = access_token(args.host, args.token)
    runs_dir = Path(args.runs_dir)
    if runs_dir.exists() and not runs_dir.is_dir():
        raise ConfigError(f"--runs-dir '{runs_dir}' is not a directory")
    sock = listen(args.host, args.port)
    port = sock.getsockname()[1]
    host = f"[{args.host.strip('[]')}]" if ":" in args.host else args.host
    print(
        f"fedforge dashboard: {runs_dir.resolve()} at http://{host}:{port}/"
        + (" (open it once with ?token=TOKEN)" if token else ""),
        flush=True,
    )
    config = uvicorn.Config(
        build_app(runs_dir, token),
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


__all__ = ["add_parser", "run"]

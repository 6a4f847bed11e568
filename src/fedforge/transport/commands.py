"""The arguments of ``fedforge server`` and ``fedforge client``, and what they
start (``cli.py`` wires them in)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedforge.core.errors import ConfigError
from fedforge.transport.ids import parse_ids

if TYPE_CHECKING:
    from fedforge.config import Config
    from fedforge.data.folder import ClientFolder
    from fedforge.server.loop import RunResult


def _security_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--certs", type=Path, help="the federation folder made by `fedforge certs`")
    p.add_argument(
        "--auth",
        choices=("mtls", "keys"),
        default="mtls",
        help="client authentication: mutual TLS (default) or registered Ed25519 keys",
    )
    p.add_argument(
        "--insecure", action="store_true", help="plaintext, unauthenticated (tests and demos only)"
    )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    server = sub.add_parser("server", help="run a federation from a config over gRPC")
    server.add_argument("--config", "-c", type=Path, help="YAML config file")
    server.add_argument("--set", "-s", action="append", default=[], metavar="FIELD=VALUE")
    server.add_argument("--data-dir", help="where the data sets are (else $FEDFORGE_DATA)")
    server.add_argument("--runs-dir", help="where run directories go (config: runs_dir)")
    server.add_argument("--resume", metavar="RUN", help="continue RUN (a run directory)")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    server.add_argument("--port", type=int, default=50051, help="0: any free port")
    server.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    server.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    server.add_argument(
        "--any-member",
        action="store_true",
        help="without DIR/members.json: any authenticated client may claim any client id "
        "nobody holds yet (said with a warning)",
    )
    _security_args(server)

    client = sub.add_parser("client", help="join a federation as one or more clients")
    client.add_argument("--server", required=True, metavar="HOST:PORT")
    hosts = client.add_mutually_exclusive_group(required=True)
    hosts.add_argument(
        "--simulate-client",
        "--clients",
        dest="clients",
        metavar="IDS",
        help="the client ids this process hosts, on the simulator's partition: 3, 0-49, 0-9,12",
    )
    hosts.add_argument(
        "--data",
        type=Path,
        metavar="PATH",
        help="this client's own examples (the server's deployment.client_data: remote): "
        "PATH/train.npz (arrays x, y) and optionally PATH/test.npz; with several "
        "--client-id ids, PATH/<id>/ holds each one's",
    )
    client.add_argument(
        "--client-id",
        metavar="N",
        help="with --data: this client's id, its files in PATH itself; several (0-24, "
        "3,5: a site hosting its devices' data): each one's files in PATH/<id>/",
    )
    client.add_argument("--name", help="this process's name (its certificate or key's)")
    client.add_argument("--key", type=Path, help="--auth keys: the Ed25519 private key")
    client.add_argument("--data-dir", help="where the data sets are (else $FEDFORGE_DATA)")
    client.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    client.add_argument(
        "--give-up-s", type=float, default=300.0, help="unreachable this long: exit"
    )
    client.add_argument("--heartbeat-s", type=float, default=2.0)
    client.add_argument(
        "--state-dir", type=Path, help="keep the hosted clients' state here (survives restarts)"
    )
    client.add_argument(
        "--trust-server-noise",
        action="store_true",
        help="add the privacy noise the server's config derives from the run seed "
        "(privacy.secret_noise: false), which the server can recompute; without it the "
        "noise comes from the OS whatever the server says",
    )
    client.add_argument(
        "--min-noise-multiplier",
        type=float,
        default=0.0,
        metavar="Z",
        help="refuse to train unless each hosted client adds privacy noise of at least Z "
        "times its clip bound (the server's config decides the mechanism)",
    )
    client.add_argument(
        "--slowdown",
        type=float,
        default=1.0,
        metavar="F",
        help="emulate a device F times slower (F >= 1): each local training is followed by "
        "F - 1 times its own time asleep, e.g. to rehearse a federation of uneven devices",
    )
    _security_args(client)


def _mode(args: argparse.Namespace) -> str:
    return "insecure" if args.insecure else str(args.auth)


def server(cfg: Config | None, args: argparse.Namespace) -> RunResult:
    from fedforge.transport.security import ServerSecurity
    from fedforge.transport.serve import ServerOptions, serve, serve_resume

    opts = ServerOptions(
        ServerSecurity(_mode(args), args.certs, args.any_member),
        args.host,
        args.port,
        args.metrics_port,
        progress=not args.quiet,
    )
    if args.resume:
        return serve_resume(args.resume, opts)
    assert cfg is not None
    return serve(cfg, opts)


def _hosted(args: argparse.Namespace) -> tuple[dict[int, ClientFolder] | None, list[int], str]:
    """The clients' own examples (read before it connects: a bad folder fails
    at once), the ids the process hosts and its default name."""
    from fedforge.data.folder import read_folders

    if args.data is None:
        if args.client_id is not None:
            raise ConfigError("--client-id N goes with --data PATH (--clients IDS names its ids)")
        return None, parse_ids(args.clients), f"clients-{args.clients}"
    if args.client_id is None:
        raise ConfigError("--data needs --client-id N, this client's id in the federation")
    ids = parse_ids(args.client_id)
    return read_folders(args.data, ids), ids, f"client-{args.client_id}"


def client(args: argparse.Namespace) -> int:
    import os

    from fedforge.transport.client import ClientProcess
    from fedforge.transport.client_options import ClientOptions
    from fedforge.transport.security import ClientSecurity

    if args.data_dir:
        os.environ["FEDFORGE_DATA"] = args.data_dir
    floor = args.min_noise_multiplier
    if not 0 <= floor < float("inf"):
        raise ConfigError(f"--min-noise-multiplier {floor} is invalid: must be a number >= 0")
    if not 1 <= args.slowdown < float("inf"):
        raise ConfigError(f"--slowdown {args.slowdown} is invalid: must be a number >= 1")
    folder, ids, name = _hosted(args)
    sec = ClientSecurity(_mode(args), args.name or name, args.certs, args.key)
    opts = ClientOptions(
        args.server,
        sec,
        ids,
        args.device,
        heartbeat_s=args.heartbeat_s,
        give_up_s=args.give_up_s,
        state_dir=args.state_dir,
        data=folder,
        trust_server_noise=args.trust_server_noise,
        min_noise_multiplier=args.min_noise_multiplier,
        slowdown=args.slowdown,
    )
    code = ClientProcess(opts).run()
    said = {0: "done", 1: "gave up: the server could not be reached", 2: "refused by the server"}
    print(f"fedforge client: {said.get(code, code)}", file=sys.stderr)
    return code

"""The ``fedforge certs`` and ``fedforge keys`` commands: a federation's security files.

``fedforge certs --out DIR --clients 0-9,12`` makes a CA, a server certificate and
client certificates ``client-0`` ... ``client-9``, ``client-12``;
``fedforge certs --out DIR --add-client NAME`` issues one more with the CA in DIR.
``fedforge keys --out FILE`` makes a client's Ed25519 identity and prints its public
key for the server's ``keys.json``.

``cryptography`` is imported only when one of these commands runs.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from fedforge.core.errors import ConfigError, shown

CLIENT_PREFIX = "client-"
MAX_NEW_CLIENTS = 10_000
_RANGE = re.compile(r"(\d+)-(\d+)")


def parse_clients(spec: str) -> list[str]:
    """Client names from a comma-separated list of numbers (``12``: ``client-12``),
    ranges (``0-9``: ``client-0`` to ``client-9``, both ends included) and names
    (``alice``); order kept, each name once."""
    names: list[str] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            raise ConfigError(f"--clients {shown(spec)} has an empty item: e.g. '0-9,12'")
        if item.isdigit():
            names.append(f"{CLIENT_PREFIX}{int(item)}")
        elif match := _RANGE.fullmatch(item):
            low, high = int(match[1]), int(match[2])
            if high < low or high - low >= MAX_NEW_CLIENTS:
                raise ConfigError(
                    f"--clients range {item!r} is invalid: FIRST-LAST with FIRST <= LAST, "
                    f"at most {MAX_NEW_CLIENTS} clients"
                )
            names += [f"{CLIENT_PREFIX}{i}" for i in range(low, high + 1)]
        else:
            names.append(item)  # a name of its own: certs checks it
        if len(names) > MAX_NEW_CLIENTS:
            raise ConfigError(f"--clients {shown(spec)} names more than {MAX_NEW_CLIENTS} clients")
    return list(dict.fromkeys(names))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the ``certs`` and ``keys`` subcommands to the ``fedforge`` parser."""
    certs = sub.add_parser(
        "certs", help="make a federation's TLS certificates (CA, server, clients), or add a client"
    )
    certs.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="the federation's folder"
    )
    what = certs.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--clients",
        metavar="SPEC",
        help="make a new federation with these clients: numbers, ranges and names, "
        "comma-separated ('0-9,12' gives client-0 .. client-9 and client-12)",
    )
    what.add_argument(
        "--add-client", metavar="NAME", help="issue one more client certificate with DIR's CA"
    )
    certs.add_argument(
        "--hosts",
        help="comma-separated host names and IP addresses clients dial "
        "(default: localhost,127.0.0.1; only with --clients)",
    )
    certs.add_argument("--days", type=int, default=365, help="validity of the certificates")
    certs.add_argument(
        "--force", action="store_true", help="replace an existing CA (or the added client's cert)"
    )

    keys = sub.add_parser(
        "keys", help="make a client's Ed25519 identity for signed requests; print its public key"
    )
    keys.add_argument(
        "--out", required=True, type=Path, metavar="FILE", help="file for the private key (0600)"
    )
    keys.add_argument("--force", action="store_true", help="replace an existing identity file")


def _print_written(paths: list[Path]) -> None:
    for path in paths:
        private = " (private, 0600)" if path.suffix == ".key" else ""
        print(f"  {path}{private}")


def run_certs(args: argparse.Namespace) -> int:
    from fedforge.transport import certs

    if args.add_client is not None:
        if args.hosts is not None:
            raise ConfigError("--hosts goes with --clients; --add-client issues a client cert")
        written = certs.add_client(args.out, args.add_client, days=args.days, force=args.force)
        print(f"fedforge: issued client certificate '{args.add_client}' with the CA in {args.out}:")
        _print_written(written)
        return 0
    names = parse_clients(args.clients)
    hosts = [h.strip() for h in (args.hosts or ",".join(certs.DEFAULT_HOSTS)).split(",")]
    written = certs.write_federation(args.out, names, hosts, days=args.days, force=args.force)
    print(
        f"fedforge: wrote a federation to {args.out}: a CA, a server certificate for "
        f"{', '.join(hosts)}, {len(names)} client certificates:"
    )
    _print_written(written)
    print("Keep ca.key off the server; give each client its own clients/<name>.pem and .key.")
    return 0


def run_keys(args: argparse.Namespace) -> int:
    from fedforge.transport import auth

    public = auth.generate_identity(args.out, force=args.force)
    print(f"fedforge: wrote an Ed25519 identity to {args.out} (private, 0600)")
    print(f"public key (base64): {auth.encode_key(public)}")
    return 0


COMMANDS = {"certs": run_certs, "keys": run_keys}

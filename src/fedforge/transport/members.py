"""Which client ids each authenticated name may host: a federation's
``members.json``, ``{"client-0": "0-24", "client-1": "25-49"}`` (a name, as its
certificate's common name or its key's ``keys.json`` entry gives it, to its ids
as ``--clients`` writes them). ``fedforge certs`` writes it; ``fedforge server``
reads it and refuses a join of an id its name is not bound to. An id is bound
to one name at most: otherwise the first of them to join would hold it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fedforge.core.errors import ConfigError, shown
from fedforge.transport.files import check_name, read_bytes, write_atomic
from fedforge.transport.ids import MAX_IDS, format_ids, parse_ids

MEMBERS_FILE = "members.json"
EXAMPLE = '{"client-0": "0-24", "client-1": "25-49"}'
_NUMBERED = re.compile(r"client-(\d+)")

Binding = dict[str, frozenset[int]]


def check_binding(binding: Mapping[str, Iterable[int]], where: str) -> Binding:
    """``binding`` with each name checked and no id bound twice (ConfigError naming
    ``where``, the id and both names)."""
    out: Binding = {}
    holder: dict[int, str] = {}
    for name, ids in binding.items():
        check_name(name, f"{where}: client name")
        out[name] = frozenset(ids)
        for cid in sorted(out[name]):
            if cid in holder:
                raise ConfigError(
                    f"{where}: client id {cid} is bound to both '{holder[cid]}' and '{name}': "
                    "an id is hosted by one name"
                )
            holder[cid] = name
    return out


def load_members(path: Path) -> Binding:
    """The binding in ``path`` (ConfigError naming the file and the bad entry)."""
    try:
        data = json.loads(read_bytes(path, "the members file"))
    except ValueError as exc:
        raise ConfigError(f"'{path}' is not JSON ({exc}): e.g. {EXAMPLE}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"'{path}' holds a JSON {type(data).__name__}: e.g. {EXAMPLE}")
    binding: dict[str, list[int]] = {}
    for name, ids in data.items():
        if not isinstance(ids, str | int) or isinstance(ids, bool):
            raise ConfigError(f"'{path}' entry {shown(name)}: {shown(ids)} is not ids like '0-24'")
        try:
            binding[name] = parse_ids(str(ids))
        except ConfigError as exc:
            raise ConfigError(f"'{path}' entry {shown(name)}: {exc}") from None
    return check_binding(binding, f"'{path}'")


def write_members(path: Path, binding: Mapping[str, Iterable[int]]) -> None:
    """Write ``binding`` to ``path`` atomically (checked first)."""
    checked = check_binding(binding, f"'{path}'")
    text = json.dumps({n: format_ids(ids) for n, ids in checked.items()}, indent=2) + "\n"
    write_atomic(path, text.encode("utf-8"), 0o644)


def parse_spec(spec: str) -> dict[str, list[int]]:
    """``--members`` as written: ``client-0=0-24,client-1=25-49,60``; an item with
    ``=`` starts a name, one without adds ids to the name before it."""
    binding: dict[str, list[int]] = {}
    name = None
    for item in (part.strip() for part in spec.split(",")):
        if "=" in item:
            name, _, item = item.partition("=")
            name = check_name(name.strip(), f"--members {shown(spec)}: client name")
            if name in binding:
                raise ConfigError(f"--members names '{name}' twice")
            binding[name] = []
        if name is None:
            raise ConfigError(f"--members {shown(spec)}: expected NAME=IDS first (client-0=0-24)")
        binding[name] += parse_ids(item)
    return binding


def numbered(names: Sequence[str], per_client: int) -> dict[str, list[int]]:
    """``client-K`` hosts ids ``K * per_client`` to ``K * per_client + per_client - 1``
    (ConfigError for a name without a number)."""
    if not 1 <= per_client <= MAX_IDS // max(1, len(names)):
        raise ConfigError(
            f"--ids-per-client {per_client} is invalid: a whole number from 1 to "
            f"{MAX_IDS // max(1, len(names))} for {len(names)} clients"
        )
    binding: dict[str, list[int]] = {}
    for name in names:
        match = _NUMBERED.fullmatch(name)
        if match is None:
            raise ConfigError(
                f"client '{name}' has no number to bind ids by: give every client its ids "
                "with --members NAME=IDS,... (e.g. alice=0-24,bob=25-49)"
            )
        first = int(match[1]) * per_client
        binding[name] = list(range(first, first + per_client))
    return binding


def summary(binding: Mapping[str, Iterable[int]], most: int = 4) -> str:
    """'client-0: 0-24, client-1: 25-49, ... (N names)' for a line of output."""
    items = [f"{n}: {format_ids(ids) or 'none'}" for n, ids in binding.items()]
    if len(items) > most:
        items = [*items[: most - 1], "...", items[-1]]
    return ", ".join(items) + f" ({len(binding)} names)"

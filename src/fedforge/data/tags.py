"""Client tags: attributes that put each client in a population group (region,
device type, a feature-shift domain), so that a model good on average can be
seen failing one group.

Tags come from three places, merged by attribute name:

- the data itself: a feature-shift partition's ``domain`` of each client, and the
  label-noise partition's ``label_noise`` (``noisy`` or ``clean``);
- a Task's data source, which may return :class:`~fedforge.data.federated.FederatedData`
  with ``tags`` set (attribute -> one group name a client);
- an ``evaluation.client_tags`` CSV of the config: a header ``client_id,<attribute>,...`` and
  one row a client. Clients without a row are in the group ``untagged``.

A later source overrides an earlier one's attribute of the same name. Where it
runs: on the server, once, when a run is built. What it trusts: nothing of the
CSV; every error names the file, the line and the value.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

from fedforge.core.errors import DataError

UNTAGGED = "untagged"  # the group of a client the CSV does not list

# attribute name -> each client's group, in client-id order
Tags = dict[str, tuple[str, ...]]


def load_client_tags(path: str | Path, num_clients: int) -> Tags:
    """The attributes of an ``evaluation.client_tags`` CSV for clients ``0..num_clients-1``."""
    where = Path(path)
    try:
        with where.open(newline="", encoding="utf-8-sig") as f:  # a BOM (Excel) is not a name
            reader = csv.reader(f)
            header = next(reader, None)
            rows = list(enumerate(reader, start=2))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"evaluation.client_tags: cannot read '{where}': {exc}") from None
    if not header or header[0].strip() != "client_id" or len(header) < 2:
        raise DataError(
            f"evaluation.client_tags: '{where}' must start with a header "
            "'client_id,<attribute>,...' "
            f"(got {','.join(header or []) or 'an empty file'!r})"
        )
    names = [h.strip() for h in header[1:]]
    bad = next((n for n in names if not n), None)
    if bad is not None or len(set(names)) != len(names):
        raise DataError(
            f"evaluation.client_tags: '{where}' header {header!r} has an empty or repeated name"
        )
    groups = {n: [UNTAGGED] * num_clients for n in names}
    seen: set[int] = set()
    for line, row in rows:
        if not row:
            continue
        client = _client_id(row[0], where, line, num_clients)
        if client in seen:
            raise DataError(
                f"evaluation.client_tags: '{where}' line {line}: client {client} listed twice"
            )
        if len(row) != len(header):
            raise DataError(
                f"evaluation.client_tags: '{where}' line {line} has {len(row)} fields; "
                f"the header has {len(header)}"
            )
        seen.add(client)
        for name, value in zip(names, row[1:], strict=True):
            groups[name][client] = value.strip() or UNTAGGED
    return {n: tuple(g) for n, g in groups.items()}


def _client_id(text: str, where: Path, line: int, num_clients: int) -> int:
    try:
        client = int(text.strip())
    except ValueError:
        client = -1
    if not 0 <= client < num_clients:
        raise DataError(
            f"evaluation.client_tags: '{where}' line {line}: client_id {text!r} must be an integer "
            f"in [0, {num_clients - 1}] (the run's clients)"
        )
    return client


def data_tags(
    num_clients: int,
    domains: tuple[str, ...] | None,
    noisy_clients: tuple[int, ...] | None,
    given: Mapping[str, tuple[str, ...]] | None,
) -> Tags:
    """The attributes the data carries: feature-shift domains, label noise, and a
    data source's own ``given`` tags (checked: one group a client)."""
    tags: Tags = {}
    if domains is not None:
        tags["domain"] = tuple(domains)
    if noisy_clients is not None:
        noisy = set(noisy_clients)
        tags["label_noise"] = tuple("noisy" if c in noisy else "clean" for c in range(num_clients))
    for name, groups in (given or {}).items():
        if len(groups) != num_clients:
            raise DataError(
                f"the data's tags {name!r} name {len(groups)} groups; "
                f"need one per client ({num_clients})"
            )
        tags[str(name)] = tuple(str(g) for g in groups)
    return tags

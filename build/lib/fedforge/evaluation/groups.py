"""Per-group evaluation: the global model's score on each population group of
clients (the clients sharing one value of a tag: a region, a device type, a
feature-shift domain; tags in fedforge.data.tags).

A group's accuracy and loss are its clients' held-out scores weighted by their
held-out examples: for classification that is the accuracy on the group's held-out
examples pooled (each client's accuracy is its correct / examples); for sequences
and regression, the example-weighted mean of its clients' scores. A client whose
score is undefined (NaN) counts in ``clients`` but not in the means. The rows go to
the run-store table ``group_eval``, one row per (round, attribute, group).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

# (attribute, group, accuracy or None, loss or None, held-out examples, clients)
GroupRow = tuple[str, str, float | None, float | None, int, int]


def _weighted(pairs: list[tuple[float, int]]) -> float | None:
    finite = [(v, n) for v, n in pairs if math.isfinite(v) and n > 0]
    total = sum(n for _, n in finite)
    return sum(v * n for v, n in finite) / total if total else None


def group_accuracies(
    tags: Mapping[str, Sequence[str]],
    client_rows: Sequence[tuple[int, float, float, int]],
) -> list[GroupRow]:
    """One row per attribute and group, sorted, from per-client rows (client,
    accuracy, loss, examples) of one evaluation round; groups with no evaluated
    client are left out."""
    out: list[GroupRow] = []
    for attribute in sorted(tags):
        groups = tags[attribute]
        members: dict[str, list[tuple[int, float, float, int]]] = {}
        for row in client_rows:
            members.setdefault(groups[row[0]], []).append(row)
        for group in sorted(members):
            rows = members[group]
            acc = _weighted([(a, n) for _, a, _, n in rows])
            loss = _weighted([(lo, n) for _, _, lo, n in rows])
            examples = sum(n for *_, n in rows)
            out.append((attribute, group, acc, loss, examples, len(rows)))
    return out

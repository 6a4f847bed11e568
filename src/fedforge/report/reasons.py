"""Refusal reasons, grouped: the one place that says which refusals count together.

Two groupings, for two audiences:

- :func:`reason_kind`: a refused update's reason as the run store holds it, with
  its numbers as ``#`` (``update norm # exceeds the bound #``). The report's
  refusals table and the dashboard's both count by it, so they agree.
- :func:`refusal_label`: a deployment server's refusal of a request or upload,
  reduced to one of a few names (:data:`LABELS`): the Prometheus metric's label
  (``fedforge_refused{reason=...}``) and the live state's refusal counts, where
  a label of unbounded values would grow the metric without end.
"""

from __future__ import annotations

import re
from collections import Counter

# a number standing alone in a refusal's reason (not part of a name such as float32)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")

# (pattern searched in the reason, label), the first match wins
LABELS = (
    ("revoked", "revoked"),
    ("signature|unknown client|timestamp|nonce|certificate", "unauthenticated"),
    ("malformed|starts with its header|second upload header", "malformed"),
    ("at most .* are taken", "oversize"),
    ("already; try again later|a name may send at once", "busy"),
    ("a second", "duplicate"),
    ("model version", "wrong_version"),
    ("was not asked", "not_asked"),
    ("SHA-256|longer than", "corrupt"),
    ("hosted by|outside this federation|unknown session", "membership"),
)
OTHER = "other"
SHOWN_KINDS = 20  # reason kinds a table names (the report's and the dashboard's); then a count


def top_kinds(counts: dict[str, int] | Counter[str]) -> list[tuple[str, int]]:
    """The ``SHOWN_KINDS`` most frequent reason kinds, then one row of how many
    other kinds there are and their count (a client choosing the text of its
    refusals cannot grow the table)."""
    counter = Counter(counts)
    top = counter.most_common(SHOWN_KINDS)
    rest = len(counter) - len(top)
    if rest:
        top.append(others_row(rest, sum(counter.values()) - sum(n for _, n in top)))
    return top


def others_row(kinds: int, count: int) -> tuple[str, int]:
    """The row that counts the reason kinds a table does not name."""
    return f"{kinds} other reasons", count


def reason_kind(reason: str) -> str:
    """A refusal's reason with its numbers as ``#``: the refusals of one rule
    (an outlier's norm, a count out of range), whatever client, round or value
    they name, counted together."""
    return _NUMBER.sub("#", reason)


def refusal_label(reason: str) -> str:
    """The label of a deployment server's refusal: the first of :data:`LABELS`
    whose pattern ``reason`` holds, else ``other``."""
    for pattern, label in LABELS:
        if re.search(pattern, reason):
            return label
    return OTHER


__all__ = [
    "LABELS",
    "OTHER",
    "SHOWN_KINDS",
    "others_row",
    "reason_kind",
    "refusal_label",
    "top_kinds",
]

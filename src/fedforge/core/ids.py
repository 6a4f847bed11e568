"""Client ids written as sorted ranges of consecutive ids, ``0-4,7``: the form
``fedforge client --clients`` and ``members.json`` take (``transport/ids.py``
reads it back), and, bounded, the form a log line or a screen shows of any
number of clients: the first ranges, then how many more there are."""

from __future__ import annotations

from collections.abc import Iterable


def id_runs(ids: Iterable[int]) -> list[tuple[int, int]]:
    """[5, 0, 1, 2, 2] -> [(0, 2), (5, 5)]: the ids' runs of consecutive values,
    first and last, ascending (repeats count once)."""
    runs: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def format_ids(ids: Iterable[int], most: int | None = None, sep: str = ",") -> str:
    """[0, 1, 2, 5] -> '0-2,5' ('' for none); ``sep``: what stands between ranges
    (', ' for people). ``most`` (1 or more): at most that many ranges, then the
    rest counted, so a line stays short at any number of clients:
    '0,2,4, and 4,997 more ranges' (which no parser reads back)."""
    return format_runs(id_runs(ids), most, sep)


def run_count(runs: Iterable[tuple[int, int]]) -> int:
    """How many ids ``runs`` (:func:`id_runs`) hold."""
    return sum(b - a + 1 for a, b in runs)


def missing_runs(total: int, runs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The runs of ``range(total)`` that ``runs`` (ascending, as :func:`id_runs`
    gives them) leave out: a count of them, however large ``total`` is."""
    gaps: list[tuple[int, int]] = []
    start = 0
    for a, b in runs:
        a, b = max(a, 0), min(b, total - 1)
        if a > b:
            continue
        if a > start:
            gaps.append((start, a - 1))
        start = b + 1
    if start < total:
        gaps.append((start, total - 1))
    return gaps


def format_runs(runs: list[tuple[int, int]], most: int | None = None, sep: str = ",") -> str:
    """``format_ids`` of ids already as runs."""
    shown = runs if most is None else runs[: max(most, 1)]
    text = sep.join(str(a) if a == b else f"{a}-{b}" for a, b in shown)
    if len(shown) < len(runs):
        left = len(runs) - len(shown)
        text += f"{sep.rstrip()} and {left:,} more range{'' if left == 1 else 's'}"
    return text

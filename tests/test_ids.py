"""Client ids as ranges (core/ids.py): written as parse_ids reads them back, and
bounded for a log line or a screen: the first ranges, then how many more."""

from __future__ import annotations

import pytest

from fedforge.core.ids import format_ids, id_runs, missing_runs
from fedforge.transport.ids import LOGGED_RANGES, logged_ids, parse_ids
from fedforge.transport.joins import progress_line


def test_runs_of_consecutive_ids_by_hand() -> None:
    assert id_runs([]) == []
    assert id_runs([5, 0, 1, 2, 2]) == [(0, 2), (5, 5)]
    assert id_runs([9, 3, 4, 11, 10]) == [(3, 4), (9, 11)]


@pytest.mark.parametrize(
    ("ids", "text"),
    [
        ([], ""),
        ([3], "3"),
        ([5, 0, 1, 2, 2], "0-2,5"),
        ([0, 2, 3, 4, 9, 10, 11], "0,2-4,9-11"),
        (range(100), "0-99"),
    ],
)
def test_ids_written_as_ranges_by_hand(ids: list[int], text: str) -> None:
    assert format_ids(ids) == text
    assert (parse_ids(text) if text else []) == sorted(set(ids))


@pytest.mark.parametrize(
    ("total", "ids"),
    [(0, []), (5, []), (5, [0, 1, 2, 3, 4]), (10, [3, 4, 9, 0]), (6, [7, -1, 2, 2]), (1, [0])],
)
def test_the_missing_runs_are_the_complements_runs(total: int, ids: list[int]) -> None:
    """Against the set of every id left out (what they are computed without)."""
    assert missing_runs(total, id_runs(ids)) == id_runs(set(range(total)) - set(ids))


def test_the_bound_names_the_first_ranges_and_counts_the_rest() -> None:
    evens = range(0, 20, 2)  # 10 ranges of one id each
    assert format_ids(evens, most=3) == "0,2,4, and 7 more ranges"
    assert format_ids(evens, most=9) == "0,2,4,6,8,10,12,14,16, and 1 more range"
    assert format_ids(evens, most=10) == "0,2,4,6,8,10,12,14,16,18"  # all fit: no count
    assert format_ids([*range(5), 7, *range(10, 13), 20], most=2) == "0-4,7, and 2 more ranges"
    assert format_ids([], most=3) == ""
    # for people: a space after each comma, thousands marked
    assert format_ids(range(0, 20_000, 2), most=2, sep=", ") == "0, 2, and 9,998 more ranges"


def test_a_log_line_names_at_most_its_bound_of_ranges() -> None:
    assert LOGGED_RANGES == 20
    first = ",".join(str(i) for i in range(0, 40, 2))  # the first 20 of 50 ranges
    assert logged_ids(range(0, 100, 2)) == f"{first}, and 30 more ranges"
    assert logged_ids(range(0, 40, 2)) == first
    assert logged_ids([*range(10), 5000]) == "0-9,5000"


def test_the_join_line_stays_short_when_the_joined_ids_are_scattered() -> None:
    """10,000 clients, every even id joined: 5,000 one-id ranges still waited for,
    named as the first 20 and a count, not a 25 kB line."""
    line = progress_line(list(range(0, 10_000, 2)), 10_000, 10_000, "09:05")
    odds = ",".join(str(i) for i in range(1, 40, 2))
    assert line == (
        f"5000 of 10000 joined; waiting for ids {odds}, and 4,980 more ranges until 09:05"
    )

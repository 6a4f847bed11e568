"""Ranges declared in a field's annotation (config/ranges.py): the words of each
form, which values pass, and a plugin's options declared the same way as a
built-in section's, refused in the same one line."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import pytest

import fedforge
from fedforge.config import from_dict
from fedforge.config.components import check_names
from fedforge.config.ranges import Most, Range, check_ranges, declared_bounds
from fedforge.core import registry
from fedforge.core.errors import ConfigError


@pytest.mark.parametrize(
    "rng, integer, words, inside, outside",
    [
        (Range("[0, 1)"), False, "must be in [0, 1)", [0.0, 0.5, 0.999], [-0.1, 1.0]),
        (Range("(0, 1]"), False, "must be in (0, 1]", [1e-9, 1.0], [0.0, 1.5]),
        (Range("(0.5, 1]"), False, "must be in (0.5, 1]", [0.51, 1.0], [0.5, 2.0]),
        (Range(">= 1"), True, "must be an integer >= 1", [1, 10**12], [0, -3]),
        (Range("> 0"), False, "must be > 0", [1e-300], [0.0, -1.0]),
        (Range("< 5"), True, "must be an integer < 5", [4, -9], [5, 6]),
        (Range("[4, 40]"), True, "must be an integer in [4, 40]", [4, 40], [3, 41]),
    ],
)
def test_each_form_says_its_range_and_holds_to_it(
    rng: Range, integer: bool, words: str, inside: list[float], outside: list[float]
) -> None:
    assert rng.says(integer) == words
    assert all(rng.allows(v) for v in inside)
    assert not any(rng.allows(v) for v in outside)
    assert not rng.allows(math.nan)


def test_a_note_and_null_are_said_after_the_range() -> None:
    rng = Range("> 0", note="seconds", null="no clipping")
    assert rng.says(False) == "must be > 0 (seconds), or null (no clipping)"
    assert Range("(0, 1]", null="").says(False) == "must be in (0, 1], or null"


def test_a_range_that_is_not_one_is_refused_when_declared() -> None:
    with pytest.raises(ValueError, match="range '0..1'"):
        Range("0..1")


@dataclass(frozen=True)
class Options:
    window: Annotated[int, Range(">= 2", note="rounds"), Most(1000, "rounds")] = 5
    rate: Annotated[float | None, Range("(0, 1)", null="the run's")] = None


def test_check_ranges_names_the_field_the_value_and_the_range() -> None:
    check_ranges(Options(), "opt.")
    check_ranges(Options(rate=None), "opt.")
    with pytest.raises(ConfigError) as exc:
        check_ranges(Options(window=1), "opt.")
    assert str(exc.value) == (
        "config field 'opt.window' = 1 is invalid: must be an integer >= 2 (rounds)"
    )
    for bad in (1.0, math.inf, math.nan):
        with pytest.raises(ConfigError, match=r"'opt.rate' = .* must be in \(0, 1\), or null"):
            check_ranges(Options(rate=bad), "opt.")
    assert declared_bounds(Options) == {"window": (2, 1000, "rounds")}


def test_a_plugins_options_are_checked_from_their_annotations() -> None:
    """A plugin declares its options as a built-in section does: the config's
    plugin_options are refused in the same one line, naming the plugin's field."""
    fedforge.register_aggregator(
        "ranged_mean", lambda context: fedforge.WeightedMean(), options=Options
    )
    try:
        base = {"robust": {"aggregator": "ranged_mean"}}
        check_names(from_dict({**base, "plugin_options": {"ranged_mean": {"window": 7}}}))
        with pytest.raises(ConfigError) as exc:
            check_names(from_dict({**base, "plugin_options": {"ranged_mean": {"window": 1}}}))
        assert str(exc.value) == (
            "config field 'plugin_options.ranged_mean.window' = 1 is invalid: "
            "must be an integer >= 2 (rounds)"
        )
    finally:
        registry.unregister("aggregator", "ranged_mean")

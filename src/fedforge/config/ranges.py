"""A numeric field's allowed values, declared once in its annotation.

    momentum: Annotated[float, Range("[0, 1)")] = 0.0
    workers: Annotated[int, Range(">= 0", note="0: one per core")] = 0
    grad_clip: Annotated[float | None, Range("> 0", null="no clipping")] = None

:func:`check_ranges` checks every such field of a section (or of a plugin's
options) after the section is read, and words the error from the declaration:
``config field 'local.momentum' = 1.5 is invalid: must be in [0, 1)``. The
parser reads the type inside ``Annotated`` as it reads a plain annotation. A
rule between fields, or one that depends on another section, stays explicit in
the section's ``check()`` or in compat.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any

from fedforge.core.errors import invalid_field

_INTERVAL = re.compile(r"([\[(])\s*(\S+?)\s*,\s*(\S+?)\s*([\])])")
_BOUND = re.compile(r"(>=|>|<=|<)\s*(\S+)")


def _number(text: str) -> float:
    return float(text)  # "inf" and "-inf" too


def _shown(x: float) -> str:
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else repr(x)


@dataclass(frozen=True)
class Range:
    """Allowed values: ``"[a, b]"`` with either end open (``(`` or ``)``), or one
    bound (``">= a"``, ``"> a"``, ``"<= b"``, ``"< b"``). ``note``: said after the
    range, in parentheses (what a value means); ``null``: the field may be null,
    and what null means ("" when it needs no word)."""

    interval: str
    note: str = ""
    null: str | None = None
    low: float = field(init=False, default=-math.inf)
    high: float = field(init=False, default=math.inf)
    low_open: bool = field(init=False, default=True)
    high_open: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        text = self.interval.strip()
        if m := _INTERVAL.fullmatch(text):
            lo, hi = _number(m.group(2)), _number(m.group(3))
            bounds = (lo, hi, m.group(1) == "(", m.group(4) == ")")
        elif m := _BOUND.fullmatch(text):
            op, x = m.group(1), _number(m.group(2))
            below = op.startswith("<")
            bounds = (
                -math.inf if below else x,
                x if below else math.inf,
                below or op == ">",
                not below or op == "<",
            )
        else:
            raise ValueError(f"range {self.interval!r}: write '[a, b]' or '>= a' style")
        for name, value in zip(("low", "high", "low_open", "high_open"), bounds, strict=True):
            object.__setattr__(self, name, value)

    def allows(self, value: float) -> bool:
        """Whether ``value`` lies in the range (NaN never does)."""
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def says(self, integer: bool) -> str:
        """The allowed values in words: ``must be an integer >= 1``, ``must be in
        (0, 1] (a fraction), or null``."""
        kind = "an integer " if integer else ""
        if math.isinf(self.low) or math.isinf(self.high):
            op, x = (
                ("<" if self.high_open else "<=", self.high)
                if math.isinf(self.low)
                else (">" if self.low_open else ">=", self.low)
            )
            core = f"{kind}{op} {_shown(x)}"
        else:
            lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
            core = f"{kind}in {lo}{_shown(self.low)}, {_shown(self.high)}{hi}"
        text = "must be " + core + (f" ({self.note})" if self.note else "")
        if self.null is not None:
            text += ", or null" + (f" ({self.null})" if self.null else "")
        return text


@functools.cache
def _declared(cls: type) -> tuple[tuple[str, Any, tuple[Any, ...]], ...]:
    """``(field, type, declarations)`` of each field of dataclass ``cls``: the type
    inside ``Annotated`` and what it declares beside it (``()`` for a plain one)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if typing.get_origin(tp) is typing.Annotated:
            base, *extras = typing.get_args(tp)
            out.append((f.name, base, tuple(extras)))
        else:
            out.append((f.name, tp, ()))
    return tuple(out)


def declared_ranges(cls: type) -> tuple[tuple[str, Range, bool], ...]:
    """``(field, range, integer)`` for each field of dataclass ``cls`` whose
    annotation declares a :class:`Range`."""
    out = []
    for name, base, extras in _declared(cls):
        numbers = [a for a in typing.get_args(base) if a is not type(None)] or [base]
        out += [(name, e, numbers == [int]) for e in extras if isinstance(e, Range)]
    return tuple(out)


def check_ranges(section: Any, prefix: str, nested: bool = True) -> None:
    """Raise ConfigError for the first field of ``section`` outside its declared
    range (named ``prefix`` + field; null passes where the range allows it, an
    infinite or NaN number never does); then, with ``nested``, those of the
    sections within it (``privacy.tiers``)."""
    cls: type = type(section)
    for name, rng, integer in declared_ranges(cls):
        value = getattr(section, name)
        if value is None and rng.null is not None:
            continue
        bad = value is None or isinstance(value, bool)
        bad = bad or (isinstance(value, float) and not math.isfinite(value))
        if bad or not rng.allows(value):
            raise invalid_field(prefix + name, value, rng.says(integer))
    if nested:
        for f in dataclasses.fields(cls):
            inner = getattr(section, f.name)
            if dataclasses.is_dataclass(inner) and not isinstance(inner, type):
                check_ranges(inner, f"{prefix}{f.name}.")


@dataclass(frozen=True)
class Most:
    """An integer field's greatest value, past which it no longer means anything
    a run can do (a million rounds, ten million clients), and what it counts;
    ``least`` when no :class:`Range` of the field says it (the seed's)."""

    greatest: int
    what: str
    least: int | None = None


@functools.cache
def declared_bounds(cls: type, prefix: str = "") -> dict[str, tuple[int, int, str]]:
    """``{dotted field: (least, greatest, what)}`` of every field of dataclass
    ``cls`` (its sections' too) that declares :class:`Most`."""
    out: dict[str, tuple[int, int, str]] = {}
    for name, base, extras in _declared(cls):
        if isinstance(base, type) and dataclasses.is_dataclass(base):
            out.update(declared_bounds(base, f"{prefix}{name}."))
        most = next((e for e in extras if isinstance(e, Most)), None)
        if most is None:
            continue
        low = most.least
        if low is None:
            rng = next(e for e in extras if isinstance(e, Range))
            low = int(rng.low) + (1 if rng.low_open else 0)
        out[prefix + name] = (low, most.greatest, most.what)
    return out

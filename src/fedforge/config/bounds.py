"""The range of every integer config field: its least value (each section's
``check()`` says why it is the least) and its greatest, a value past which the
field no longer means anything a run can do (a million rounds, ten million
clients, a billion examples a client). A value past the greatest is one
:class:`ConfigError` naming the field, its value and the range, before anything
sizes a buffer, a window or a loop by it (``robust.norm_window: 2**63`` once
ended in an OverflowError, ``batch_size: 2**63`` in torch's ValueError).

Each integer field declares its greatest value in its annotation, beside its
least (config/ranges.py: ``Annotated[int, Range(">= 1"), Most(MAX_ROUNDS,
"rounds")]``); ``check_bounds`` walks the config's dataclasses (an integer field
declaring none is a programming error: tests/test_config_limits.py)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from fedforge.config.ranges import declared_bounds
from fedforge.core.errors import invalid_field

MAX_ROUNDS = 1_000_000  # a round a minute for two years
MAX_CLIENTS = 10_000_000
MAX_EXAMPLES = 1_000_000_000  # one client's examples, a batch's
MAX_BYTES = 10**18  # bytes a run moves: an exabyte
MAX_STEPS = 10_000  # iterations of a loop run per round or per update
DEFAULT_REFUSED_WINDOW = 10  # robust.refused_window's default
SEED_BITS = 63  # derived generators take a 64-bit seed


def allowed(low: int, high: int, what: str) -> str:
    """A range of integers in words."""
    return f"must be an integer in [{low:,}, {high:,}] ({what})"


def integer_fields(cls: Any, prefix: str = "") -> tuple[str, ...]:
    """The dotted names of ``cls``'s integer fields (an int, an int or null, a
    tuple of ints), its sections' too."""
    key = (cls, prefix)
    if key not in _FIELDS:
        _FIELDS[key] = _integer_fields(cls, prefix)
    return _FIELDS[key]


_FIELDS: dict[tuple[Any, str], tuple[str, ...]] = {}


def _integer_fields(cls: Any, prefix: str) -> tuple[str, ...]:
    hints = typing.get_type_hints(cls)
    names: tuple[str, ...] = ()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            names += integer_fields(tp, f"{prefix}{f.name}.")
        elif tp is int or int in typing.get_args(tp):
            names += (prefix + f.name,)
    return names


def check_bounds(cfg: Any) -> None:
    """Every integer field of ``cfg`` within its declared range (after the
    sections' own checks, which say why a least value is the least); a field
    declaring no :class:`~fedforge.config.ranges.Most` is a programming error."""
    cls: type = type(cfg)
    bounds = declared_bounds(cls)
    for name in integer_fields(type(cfg)):
        value: Any = cfg
        for part in name.split("."):
            value = getattr(value, part)
        values = value if isinstance(value, tuple) else (value,)
        low, high, what = bounds[name]
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and not low <= v <= high:
                raise invalid_field(name, value, allowed(low, high, what))


def refused_window_fits_run(cfg: Any) -> None:
    """``robust.refused_window`` at most the run's upload rounds: the stop on
    refused updates judges a full window only, so a longer one never stops the
    run. The default (10) stands for runs shorter than it."""
    r = cfg.robust
    uploads = -(-cfg.rounds // cfg.communication.upload_every)
    most = max(uploads, DEFAULT_REFUSED_WINDOW)
    if r.max_refused_fraction is not None and r.refused_window > most:
        raise invalid_field(
            "robust.refused_window",
            r.refused_window,
            f"must be an integer in [1, {most}]: the run has {uploads} upload rounds, and "
            "a window it never fills never stops it (robust.max_refused_fraction)",
        )

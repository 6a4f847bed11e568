"""Client ids as people write them: ``3``, ``0-49``, ``0-9,12``. :func:`parse_ids`
reads them; :func:`format_ids` (``core/ids.py``) writes them, and
:func:`logged_ids` writes them for a log line, bounded."""

from __future__ import annotations

from collections.abc import Iterable

from fedforge.core.errors import ConfigError
from fedforge.core.ids import format_ids

__all__ = ["LOGGED_RANGES", "MAX_IDS", "format_ids", "logged_ids", "parse_ids"]

# more ids than any federation this code runs: a typo such as 0-1000000000 is
# refused in one line instead of filling the memory
MAX_IDS = 10_000_000
# the ranges a log line names of a set of client ids; the rest are counted
LOGGED_RANGES = 20


def parse_ids(text: str) -> list[int]:
    """'0-9,12' -> [0, ..., 9, 12] (ConfigError naming the bad part)."""
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if hi else int(lo)
        except ValueError:
            raise ConfigError(f"client ids {part!r}: expected N or N-M (e.g. 0-49,52)") from None
        if a < 0 or b < a:
            raise ConfigError(f"client ids {part!r}: expected 0 <= N <= M")
        if len(ids) + b - a + 1 > MAX_IDS:
            raise ConfigError(f"client ids {text[:80]!r}: more than {MAX_IDS} ids")
        ids.extend(range(a, b + 1))
    return sorted(set(ids))


def logged_ids(ids: Iterable[int]) -> str:
    """``ids`` as ranges for a log line: at most ``LOGGED_RANGES`` of them, then
    how many more (a federation of 10,000 scattered ids is still one short line)."""
    return format_ids(ids, most=LOGGED_RANGES)

"""Client ids as people write them: ``3``, ``0-49``, ``0-9,12``."""

from __future__ import annotations

from fedforge.core.errors import ConfigError


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
        ids.extend(range(a, b + 1))
    return sorted(set(ids))

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


def format_ids(ids: list[int]) -> str:
    """[0, ..., 9, 12] -> '0-9,12' (sorted runs: readable at any count); '' for none."""
    runs: list[str] = []
    ordered = sorted(set(ids))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)

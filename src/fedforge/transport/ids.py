"""Client ids as people write them: ``3``, ``0-49``, ``0-9,12``."""

from __future__ import annotations

from collections.abc import Iterable

from fedforge.core.errors import ConfigError

# more ids than any federation this code runs: a typo such as 0-1000000000 is
# refused in one line instead of filling the memory
MAX_IDS = 10_000_000


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


def format_ids(ids: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5': what :func:`parse_ids` reads back."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)

"""The headline figures of one stored run, from its rows and its summary: best
and final evaluated rounds, bytes each way, wall time, privacy spent. ``fedforge
show`` prints them; the HTML report and ``fedforge compare`` tabulate them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedforge.store.records import RoundRecord


@dataclass(frozen=True)
class Headline:
    """What a run reached, and what it cost."""

    rounds: int  # recorded
    best: RoundRecord | None  # the evaluated round of the highest test accuracy (first such)
    final: RoundRecord | None  # the last evaluated round
    bytes_up: int
    bytes_down: int
    wall_seconds: float
    epsilon: float | None  # spent after the last recorded round (DP runs)

    @property
    def best_accuracy(self) -> float | None:
        return None if self.best is None else self.best.test_accuracy

    @property
    def final_accuracy(self) -> float | None:
        return None if self.final is None else self.final.test_accuracy

    @property
    def rounds_to_best(self) -> int | None:
        """The best round counted from 1."""
        return None if self.best is None else self.best.round_idx + 1


def headline(
    rounds: list[RoundRecord],
    summary: dict[str, Any] | None,
    privacy: Sequence[tuple[int, float | None, float, float | None]] = (),
) -> Headline:
    """The headline of a run with these ``rounds``, ``summary`` (None: unfinished)
    and ``privacy`` rows (``RunStore.privacy()``). The wall time is the summary's
    (which counts evaluation and start-up too) or, for a run without one, the sum
    of its rounds' seconds."""
    evaluated = [r for r in rounds if r.test_accuracy is not None]
    best = max(evaluated, key=lambda r: r.test_accuracy or 0.0, default=None)
    wall = (summary or {}).get("wall_seconds")
    if not isinstance(wall, int | float):  # an unfinished run's (or a damaged summary's)
        wall = sum(r.seconds for r in rounds)
    epsilon = privacy[-1][1] if privacy else None
    if epsilon is None:  # a run's summary holds the last figure too
        spent = ((summary or {}).get("privacy") or {}).get("epsilon")
        epsilon = float(spent) if isinstance(spent, int | float) else None
    return Headline(
        rounds=len(rounds),
        best=best,
        final=evaluated[-1] if evaluated else None,
        bytes_up=sum(r.bytes_up for r in rounds),
        bytes_down=sum(r.bytes_down for r in rounds),
        wall_seconds=float(wall),
        epsilon=epsilon,
    )

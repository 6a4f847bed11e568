"""Round metrics: rounds to a target accuracy, as McMahan et al. 2017 count them.

The paper reads the number of rounds off the monotone best-so-far accuracy curve
and interpolates linearly between the two evaluations that straddle the target
("we ... report the number of rounds ... by linearly interpolating between the
rounds where the target is first exceeded"), so rounds can be fractional.
"""

from __future__ import annotations

from collections.abc import Sequence


def best_so_far(accuracies: Sequence[float]) -> list[float]:
    """The running maximum of an accuracy curve."""
    out: list[float] = []
    best = float("-inf")
    for a in accuracies:
        best = max(best, a)
        out.append(best)
    return out


def rounds_to_target(
    rounds: Sequence[float], accuracies: Sequence[float], target: float
) -> float | None:
    """Rounds (1-based count of rounds done) at which the best-so-far curve first
    reaches ``target``, linearly interpolated between evaluations; ``None`` if it
    never does. ``rounds[i]`` is the number of rounds done at evaluation ``i``;
    before any round the curve starts at (0, first accuracy) only implicitly, so a
    target reached at the first evaluation returns that evaluation's round."""
    if len(rounds) != len(accuracies):
        raise ValueError("rounds and accuracies must have the same length")
    curve = best_so_far(accuracies)
    for i, acc in enumerate(curve):
        if acc >= target:
            if i == 0:
                return float(rounds[0])
            r0, a0, r1 = rounds[i - 1], curve[i - 1], rounds[i]
            return float(r0 + (target - a0) / (acc - a0) * (r1 - r0))
    return None


def bytes_at(rounds_done: float, per_round: Sequence[float]) -> float:
    """Cumulative bytes after ``rounds_done`` rounds, ``per_round[i]`` being round
    i's bytes; a fractional count (an interpolated rounds-to-target) takes that
    fraction of the next round's bytes."""
    whole = min(int(rounds_done), len(per_round))
    done = float(sum(per_round[:whole]))
    if whole < len(per_round):
        done += (rounds_done - whole) * per_round[whole]
    return done


def seconds_at(rounds_done: float, durations: Sequence[float]) -> float:
    """Virtual seconds after ``rounds_done`` rounds of these ``durations``: the
    time to a target, read as bytes to it are (:func:`bytes_at`)."""
    return bytes_at(rounds_done, durations)

"""How evenly a run's cohorts spread over its clients: per-client counts of
rounds asked and used, Jain's fairness index and the Gini coefficient of those
counts (over every client of the run, the never-asked counting 0), the clients
never asked, and the time each client waited for its first cohort (rounds, and
virtual seconds where the run has a clock).

Jain et al. 1984: J = (sum x)^2 / (n sum x^2), 1 when all are equal, 1/n when one
client has everything. Gini: G = sum_i sum_j |x_i - x_j| / (2 n^2 mean), 0 when
all are equal, (n - 1) / n when one has everything. The Lorenz curve: the share
of all participations held by the fraction of clients that participated least.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedforge.core.ids import format_ids

LORENZ_POINTS = 200  # points of a drawn Lorenz curve, at most
NEVER_SHOWN = 8  # ranges of never-asked ids named in a summary


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2); 1.0 for an empty or all-zero set."""
    x = np.asarray(values, dtype=np.float64)
    squares = float((x * x).sum())
    return 1.0 if len(x) == 0 or squares == 0.0 else float(x.sum() ** 2 / (len(x) * squares))


def gini(values: Sequence[float]) -> float:
    """The Gini coefficient of non-negative ``values``; 0.0 for none or all zero."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n, total = len(x), float(x.sum()) if len(x) else 0.0
    if n == 0 or total == 0.0:
        return 0.0
    # sum_i sum_j |x_i - x_j| = 2 sum_i (2 i - n - 1) x_(i), i from 1, x sorted
    ranks = np.arange(1, n + 1)
    return float(((2 * ranks - n - 1) * x).sum() / (n * total))


def lorenz(values: Sequence[float], points: int = LORENZ_POINTS) -> dict[str, list[float]]:
    """The Lorenz curve of ``values``: (share of clients, share of the total),
    from (0, 0) to (1, 1), at most ``points`` + 1 points (evenly spaced ranks)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    if n == 0 or float(x.sum()) == 0.0:
        return {"clients": [0.0, 1.0], "share": [0.0, 1.0]}
    cum = np.concatenate([[0.0], np.cumsum(x) / x.sum()])
    ranks = np.unique(np.linspace(0, n, min(n, points) + 1).round().astype(int))
    return {"clients": (ranks / n).tolist(), "share": cum[ranks].tolist()}


def waited_seconds(first: int, round_ends: Mapping[int, float]) -> float | None:
    """Virtual seconds before round ``first`` began: the clock at the end of the
    round before (0 for the first round); None where that round has no time."""
    if first == 0:
        return 0.0
    return round_ends.get(first - 1)


def participation(
    num_clients: int,
    asked: Mapping[int, int],
    used: Mapping[int, int],
    first_asked: Mapping[int, int],
    round_ends: Mapping[int, float] | None = None,
) -> dict[str, Any]:
    """The figures of a run's participation, JSON-ready. ``asked``/``used``: rounds
    per client (absent: 0); ``first_asked``: each asked client's first cohort's
    round (0-based); ``round_ends``: the virtual clock at each round's end, if any."""
    ids = range(num_clients)
    asked_n = [asked.get(c, 0) for c in ids]
    used_n = [used.get(c, 0) for c in ids]
    never = [c for c in ids if asked_n[c] == 0]
    waits = sorted(first_asked[c] for c in first_asked if c < num_clients)
    seconds = [waited_seconds(r, round_ends) for r in waits] if round_ends else []
    known = sorted(s for s in seconds if s is not None)
    return {
        "num_clients": num_clients,
        "asked_total": sum(asked_n),
        "used_total": sum(used_n),
        "never_asked": len(never),
        "never_asked_ids": format_ids(never, NEVER_SHOWN, ", ") if never else "",
        "never_used": sum(1 for n in used_n if n == 0),
        "jain_asked": jain_index(asked_n),
        "gini_asked": gini(asked_n),
        "jain_used": jain_index(used_n),
        "gini_used": gini(used_n),
        # rounds that passed before a client's first cohort (0: asked in the first)
        "first_asked_median_rounds": statistics.median(waits) if waits else None,
        "first_asked_max_rounds": waits[-1] if waits else None,
        "first_asked_median_s": statistics.median(known) if known else None,
        "first_asked_max_s": known[-1] if known else None,
    }


def participation_line(p: Mapping[str, Any]) -> str:
    """One line of a run's participation (the end-of-run lines, ``fedforge show``)."""
    asked = p["num_clients"] - p["never_asked"]
    text = (
        f"{asked} of {p['num_clients']} clients asked; Jain {p['jain_asked']:.3f}, "
        f"Gini {p['gini_asked']:.3f} (rounds asked)"
    )
    if p["first_asked_max_rounds"] is not None:
        text += f"; first asked after {p['first_asked_median_rounds']:g} rounds (median)"
        text += f", {p['first_asked_max_rounds']} (last)"
    if p.get("first_asked_median_s") is not None:
        text += f", {p['first_asked_median_s']:.4g} s virtual (median)"
    if p["never_asked"]:
        text += f"; never asked: {p['never_asked_ids']}"
    return text

"""The clients the server knows, each with the example count it declared when
it joined, and the weight rule that makes a count claim safe to use.

``num_examples`` is self-reported: a client that claims 10^12 examples in one
upload would otherwise become the whole weighted mean. A client's weight is the
count its upload reports, at most the count it declared when it joined, and
that declaration is itself capped at ``robust.max_weight_ratio`` times the
federation's median declaration (so a client that lies when it joins weighs at
most that multiple of a typical client). In simulation and in a deployment on
the simulator's partition the declarations are the partition's sizes; a
deployment whose clients bring their own data takes them from the clients'
joins (a client not joined yet declares 0, and the median is of the clients
that declared examples). Runs on the server; trusts nothing a client says
beyond these bounds.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import numpy as np

from fedforge.server.experiment import Experiment


class Registry:
    """Declared example counts, each capped at ``ratio`` x their median (None:
    uncapped), and the weight they allow."""

    def __init__(self, declared: Sequence[int] | np.ndarray, ratio: float | None) -> None:
        counts = np.asarray(declared, dtype=np.float64)
        held = counts[counts > 0]
        self.median = float(np.median(held)) if len(held) else 0.0
        self.ratio = ratio
        limit = counts if ratio is None else np.minimum(counts, ratio * self.median)
        # one float64 array (no Python object a client); a worker's cut, a dict
        self.limits: np.ndarray | dict[int, float] = limit

    def only(self, client_ids: Iterable[int]) -> Registry:
        """This registry with the limits of ``client_ids`` alone (a worker's cut)."""
        cut = copy.copy(self)
        cut.limits = {c: float(self.limits[c]) for c in client_ids}
        return cut

    def weight(self, client_id: int, reported: int) -> float:
        """The weight of an update that reports ``reported`` examples."""
        return float(min(reported, self.limits[client_id]))

    def describe(self) -> str:
        """The rule in force, in one line."""
        rule = "num_examples as reported, at most the count each client declared when it joined"
        if self.ratio is None:
            return rule + " (declarations uncapped: robust.max_weight_ratio = null)"
        return (
            f"{rule}, declarations capped at {self.ratio:g} x their median "
            f"({self.median:g}; robust.max_weight_ratio)"
        )


def weight_rule(exp: Experiment) -> str:
    """The aggregation weight rule of a run, in one line."""
    cfg = exp.cfg
    line = Registry(exp.client_sizes(), cfg.robust.max_weight_ratio).describe()
    if cfg.aggregation.weights != "num_examples":
        line += f"; then weighed by aggregation.weights = '{cfg.aggregation.weights}'"
    return line

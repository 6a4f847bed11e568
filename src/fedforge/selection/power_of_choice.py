"""``power_of_choice``: Cho, Wang and Joshi 2020, "Client Selection in Federated
Learning: Convergence Analysis and Power-of-Choice Selection Strategies"
(arXiv:2010.01243), in its communication- and computation-free variant rpow-d.

Each upload period the server draws a candidate set A of ``d`` clients without
replacement, with probabilities proportional to their example counts
p_k = n_k / sum n, and asks the ``size`` candidates of highest local loss. The
paper's pow-d has the candidates compute their loss on the current global
model (a round trip more); rpow-d, followed here, takes the training loss each
client reported with its last taken update instead. A client whose loss is
unknown ranks first (treated as +inf: explored before any known one), unless
the server refused an upload of it: a client refused and never taken ranks
last (-inf), so a client whose updates the gates always refuse is not asked
first in every round (its loss would stay unknown forever); ties keep the
draw's order. d = size is the n_k-weighted draw;
larger d biases the cohort towards high losses (faster early, a larger floor
of the error: the paper's trade-off). The paper's adaptive d is not offered.

It reads the reported losses (``reads_losses``): refused where the run's
privacy keeps them from the server (secure aggregation), as with DP.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fedforge.core.errors import ConfigError

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext
    from fedforge.selection.history import ClientHistory
    from fedforge.selection.named import SelectionRound


def candidates(round: SelectionRound, d: int) -> list[int]:
    """``d`` of the ids that may be asked, drawn without replacement with
    probabilities proportional to n_k (uniformly among those holding none when
    fewer than ``d`` hold any), in draw order."""
    pool = list(round.among)
    ids = np.asarray(pool, dtype=np.int64)
    weights = round.history.column("num_examples")[ids].astype(np.float64)
    held = int(np.count_nonzero(weights))
    p = weights / weights.sum() if held >= d else None
    if p is None and held:  # every holder first, then the empty ones to make up d
        order = [pool[i] for i in round.rng.permutation(len(pool)) if weights[i] > 0]
        rest = [pool[i] for i in round.rng.permutation(len(pool)) if weights[i] == 0]
        return [*order, *rest][:d]
    return [pool[int(i)] for i in round.rng.choice(len(pool), size=d, replace=False, p=p)]


class PowerOfChoice:
    """rpow-d with ``d`` candidates (None: twice the cohort), at least the cohort."""

    reads_losses = True

    def __init__(self, d: int | None) -> None:
        self.d = d

    def select(self, round: SelectionRound) -> list[int]:
        d = 2 * round.size if self.d is None else self.d
        drawn = candidates(round, min(len(round.among), max(d, round.size)))
        # Python's sort is stable: ties in draw order
        key = {c: -rank_loss(round.history[c]) for c in drawn}
        ranked = sorted(drawn, key=key.__getitem__)
        return ranked[: round.size]


def rank_loss(row: ClientHistory) -> float:
    """The loss a candidate ranks by: its last reported one; +inf when unknown
    (never taken), -inf when unknown and an upload of it was refused."""
    if row.last_loss is not None:
        return row.last_loss
    return -math.inf if row.refused else math.inf


def factory(context: ComponentContext) -> PowerOfChoice:
    d, clients = context.options.d, context.cfg.num_clients
    if d is not None and d > clients:
        raise ConfigError(
            f"plugin_options.power_of_choice.d = {d} must be at most num_clients = {clients}"
        )
    return PowerOfChoice(d)

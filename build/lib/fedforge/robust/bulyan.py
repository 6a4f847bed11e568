"""Bulyan (El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of
Distributed Learning in Byzantium", ICML 2018). Runs on the server over the
gathered ``[K, P]`` updates; trusts no single update and ignores the
self-reported ``num_examples`` (one vote each).

With n >= 4f + 3 updates: pick theta = n - 2f of them by Krum applied again and
again to the ones not yet picked (each time the lowest-score one moves to the
selection); then per coordinate average the beta = theta - 2f selected values
closest to the selection's median (of two equally close, the lower). Krum's
neighbour count n' - f - 2 falls below one for the last picks; it is kept at one
(the paper leaves this case open). Refuses n < 4f + 3.
"""

from __future__ import annotations

import torch

from fedforge.aggregation.mean import Accumulator
from fedforge.robust.common import (
    RowStack,
    by_columns,
    check_inputs,
    refuse_below,
    sort_columns,
    sorted_median,
    squared_distances,
    stable_argsort_columns,
)
from fedforge.robust.krum import _check_f, krum_scores


class Bulyan:
    """Krum selection of n - 2f updates, then a trimmed average around the median."""

    name = "bulyan"
    needs_individual = True
    linear = False

    def __init__(self, f: int) -> None:
        self.f = _check_f(self.name, f)

    def min_updates(self) -> int:
        return 4 * self.f + 3

    def select(self, updates: torch.Tensor) -> torch.Tensor:
        """The rows picked by repeated Krum, in the order they were picked."""
        n, f = updates.shape[0], self.f
        dist = squared_distances(updates)
        left = list(range(n))
        picked: list[int] = []
        for _ in range(n - 2 * f):
            idx = torch.tensor(left)
            scores = krum_scores(dist[idx][:, idx], f)
            best = int(torch.sort(scores, stable=True).indices[0])
            picked.append(left.pop(best))
        return torch.tensor(picked)

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_inputs(updates, weights)
        n, f = updates.shape[0], self.f
        refuse_below(self.name, n, f, self.min_updates(), "4f + 3")
        chosen = updates[self.select(updates).sort().values]
        beta = chosen.shape[0] - 2 * f

        def closest_mean(block: torch.Tensor) -> torch.Tensor:
            s = sort_columns(block)
            # stable: of two values equally far from the median the lower one wins
            near = stable_argsort_columns((s - sorted_median(s)).abs())[:beta]
            return s.gather(0, near).mean(dim=0)

        return by_columns(chosen, closest_mean)

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return RowStack(self.aggregate)

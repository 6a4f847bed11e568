"""Power-of-Choice client selection (Cho, Wang and Joshi 2020, "Client Selection
in Federated Learning: Convergence Analysis and Power-of-Choice Selection
Strategies"), its communication-free variant rpow-d: each round the server
draws a candidate set of ``d`` clients without replacement with probability
proportional to their example counts n_k, then asks the ``size`` candidates
with the highest training loss they last reported (a client never heard from
first: its loss is unknown, so it may be the highest; one whose uploads were
refused and never taken last, or it would be asked first every round). No client computes
anything extra: the losses are those its past updates carried.

Written outside the package through the public API:

    fedforge run --plugin examples/power_of_choice.py --config examples/power_of_choice.yaml

Biased towards high-loss clients, it converges faster early and to a point
further from the optimum (the paper's trade-off, set by ``d``: d = size is
the n_k-weighted draw). It reads what the server knows, so the run's privacy
accounting, which assumes a uniform sample, refuses it; and it says it ranks
by the reported losses (``reads_losses``), so secure aggregation, which keeps
them from the server, refuses it too.

fedforge has this rule built in, with the paper's options, as
``selection.policy: power_of_choice`` (selection/power_of_choice.py); this file
shows how a policy of one's own is written and registered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import fedforge


@dataclass(frozen=True)
class Options:
    d: int = 20  # candidates drawn each round (the paper's d; below the cohort size: that size)

    def check(self) -> None:
        if not self.d >= 1:
            raise ValueError(f"d = {self.d} must be an integer >= 1 (candidates a round)")


class PowerOfChoice:
    reads_losses = True  # refused where the run's privacy hides the losses

    def __init__(self, d: int) -> None:
        self.d = d

    def select(self, round: fedforge.SelectionRound) -> list[int]:
        among = np.asarray(round.among)
        n = np.array([round.history[int(c)].num_examples for c in among], dtype=np.float64)
        d = min(len(among), max(self.d, round.size))  # a deployment may over-select
        p = n / n.sum() if np.count_nonzero(n) >= d else None  # else too few with examples
        candidates = round.rng.choice(len(among), size=d, replace=False, p=p)

        def unknown_then_loss(i: int) -> tuple[int, float]:
            # unknown first, then by loss; unknown and refused (a client whose
            # updates the server's gates reject: its loss stays unknown) last
            row = round.history[int(among[i])]
            if row.last_loss is None:
                return (2 if row.refused else 0, 0.0)
            return (1, -row.last_loss)

        ranked = sorted(candidates, key=unknown_then_loss)  # stable: ties in draw order
        return [int(among[i]) for i in ranked[: round.size]]


def factory(context: fedforge.ComponentContext) -> PowerOfChoice:
    d, clients = context.options.d, context.cfg.num_clients
    if d > clients:
        raise fedforge.ConfigError(
            f"plugin_options.pow_d.d = {d} must be at most {clients} (the clients)"
        )
    return PowerOfChoice(d)


fedforge.register_selection("pow_d", factory, options=Options)

"""The ``aggregation`` section: each client's weight in the server's weighted
mean. ``num_examples`` is FedAvg's n_k / n; the others map it (aggregation/
weights.py) or weigh what each client reports (client/reports.py). How the
weights combine with DP, secure aggregation, robust aggregators and edge groups
is checked in compat.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_EXAMPLES
from fedforge.config.ranges import Most, Range
from fedforge.core.errors import invalid_field

WeightRule = Literal["num_examples", "uniform", "sqrt", "capped", "quality", "class"]


@dataclass(frozen=True)
class AggregationConfig:
    """The weighted mean's weight per client: num_examples, uniform, sqrt, capped
    (min(num_examples, weight_cap)), quality (num_examples x exp(-validation loss
    / T)), class (sum_c n_kc / N_c)."""

    weights: WeightRule = "num_examples"
    # capped: min(num_examples, weight_cap) (central DP's cap is privacy.weight_cap)
    weight_cap: Annotated[int | None, Most(MAX_EXAMPLES, "examples a client", least=1)] = None
    quality_temperature: Annotated[float, Range("> 0", note="T of exp(-loss / T)")] = 1.0
    # quality: each client's validation split (not trained on)
    quality_holdout: Annotated[float, Range("(0, 1)", note="each client's validation split")] = 0.1

    def check(self) -> None:
        cap = self.weight_cap
        if (cap is not None and cap < 1) or (self.weights == "capped" and cap is None):
            raise invalid_field(
                "aggregation.weight_cap",
                cap,
                "must be an integer >= 1 (and is needed by aggregation.weights = 'capped')",
            )

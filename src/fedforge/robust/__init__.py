"""Robust aggregation: the rules that see each update, and how refused faults lower their f.

``mean`` is FedAvg's weighted mean (linear, streams). The robust rules see
each update (``needs_individual``): coordinate-wise ``median`` and
``trimmed_mean`` (Yin et al. 2018), ``krum``/``multi_krum`` (Blanchard et al.
2017), ``bulyan`` (El Mhamdi et al. 2018), ``geometric_median`` (RFA,
Pillutla et al. 2022), ``norm_bound`` and ``centred_clip`` (Sun et al. 2019;
Karimireddy et al. 2021).

How ``num_examples`` enters: it is self-reported, so a Byzantine client could
claim a billion examples and outvote everyone. The voting rules (median,
trimmed mean, Krum, Multi-Krum, Bulyan, geometric median, centred clipping)
therefore give every accepted update one vote and ignore the weights;
``norm_bound`` is FedAvg on bounded updates and keeps the ``num_examples``
weights (its defence is the bound, not the vote).
"""

import copy

from fedforge.aggregation.mean import Accumulator, Aggregator, WeightedMean
from fedforge.robust.bulyan import Bulyan
from fedforge.robust.clipping import CentredClip, NormBound
from fedforge.robust.coordinate import Median, TrimmedMean
from fedforge.robust.geomed import GeometricMedian
from fedforge.robust.krum import Krum, MultiKrum


def min_updates(aggregator: Aggregator) -> int:
    """The fewest updates ``aggregator`` accepts (Krum: 2f + 3, Bulyan: 4f + 3)."""
    fn = getattr(aggregator, "min_updates", None)
    return int(fn()) if callable(fn) else 1


def discount_faulty(aggregator: Aggregator, faulty: int) -> Aggregator:
    """``aggregator`` with its f lowered by ``faulty`` (never below 0), for Krum,
    Multi-Krum and Bulyan; any other aggregator unchanged.

    f bounds the Byzantine updates in a cohort. An upload the server refused as
    malformed, non-finite or past a norm bound (``robust.max_update_ratio``, or
    ``robust.max_norm_multiple`` times the median norm: sizes no honest client of
    a sane configuration comes near) was faulty (Byzantine covers any fault),
    so among the updates the rule still sees at most f - faulty are. Without
    this, a gate that refuses the attackers leaves Krum with n < 2f + 3 and the
    round is skipped: the model freezes exactly when the attack was stopped.
    Refusals that are not proof of a fault do not count: a client withholding
    its own update, and the statistical cohort gates (norm, cosine), which can
    refuse an honest client and would then leave f too low.
    """
    f = getattr(aggregator, "f", None)
    if faulty <= 0 or not isinstance(f, int) or f == 0:
        return aggregator
    lowered = copy.copy(aggregator)
    lowered.f = max(0, f - faulty)  # type: ignore[attr-defined]
    return lowered


__all__ = [
    "Accumulator",
    "Aggregator",
    "Bulyan",
    "CentredClip",
    "GeometricMedian",
    "Krum",
    "Median",
    "MultiKrum",
    "NormBound",
    "TrimmedMean",
    "WeightedMean",
    "discount_faulty",
    "min_updates",
]

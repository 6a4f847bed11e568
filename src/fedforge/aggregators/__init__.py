"""Aggregators: how the server combines a cohort's deltas into one.

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

from fedforge.aggregators.bulyan import Bulyan
from fedforge.aggregators.clipping import CentredClip, NormBound
from fedforge.aggregators.coordinate import Median, TrimmedMean
from fedforge.aggregators.geomed import GeometricMedian
from fedforge.aggregators.krum import Krum, MultiKrum
from fedforge.aggregators.mean import Accumulator, Aggregator, WeightedMean


def min_updates(aggregator: Aggregator) -> int:
    """The fewest updates ``aggregator`` accepts (Krum: 2f + 3, Bulyan: 4f + 3)."""
    fn = getattr(aggregator, "min_updates", None)
    return int(fn()) if callable(fn) else 1


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
    "min_updates",
]

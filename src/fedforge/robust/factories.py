"""The built-in aggregators' factories, by the names core/builtins.py registers:
each reads its parameters from the config's ``robust`` section."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedforge import robust as agg

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext


def mean(context: ComponentContext) -> agg.Aggregator:
    return agg.WeightedMean()


def median(context: ComponentContext) -> agg.Aggregator:
    return agg.Median()


def trimmed_mean(context: ComponentContext) -> agg.Aggregator:
    return agg.TrimmedMean(context.cfg.robust.trim_fraction)


def krum(context: ComponentContext) -> agg.Aggregator:
    return agg.Krum(context.cfg.robust.byzantine)


def multi_krum(context: ComponentContext) -> agg.Aggregator:
    r = context.cfg.robust
    return agg.MultiKrum(r.byzantine, r.multi_krum_m)


def bulyan(context: ComponentContext) -> agg.Aggregator:
    return agg.Bulyan(context.cfg.robust.byzantine)


def geometric_median(context: ComponentContext) -> agg.Aggregator:
    r = context.cfg.robust
    return agg.GeometricMedian(r.geomed_max_iter, r.geomed_tol)


def norm_bound(context: ComponentContext) -> agg.Aggregator:
    r = context.cfg.robust
    return agg.NormBound(r.norm_bound, r.norm_window)


def centred_clip(context: ComponentContext) -> agg.Aggregator:
    r = context.cfg.robust
    return agg.CentredClip(r.norm_bound, r.norm_window, r.centred_clip_iterations)

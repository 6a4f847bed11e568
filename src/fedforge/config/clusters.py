"""The options of the clustered algorithms (``algorithm: cfl`` and ``algorithm:
ifca``; algorithms/clustered.py), as a config gives them under
``plugin_options`` by the algorithm's name (``plugin_options: {ifca: {clusters:
3}}``), each field's allowed values declared in its annotation
(config/ranges.py). This module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fedforge.config.ranges import Most, Range

MAX_CLUSTERS = 64  # models the server keeps at once


@dataclass(frozen=True)
class CflOptions:
    """Clustered FL (Sattler, Mueller, Samek 2020): a cluster is split in two by
    the cosine similarity of its clients' updates when its mean update is small
    (``mean_norm_below``, their epsilon_1: near a stationary point of the
    cluster's joint loss) while some client's is still large
    (``max_norm_above``, epsilon_2: a client far from its own optimum)."""

    mean_norm_below: Annotated[float, Range("> 0", note="epsilon_1")] = 0.4
    max_norm_above: Annotated[float, Range("> 0", note="epsilon_2")] = 0.8
    # the largest cosine similarity across the two halves a split may leave
    max_cross_cosine: Annotated[float, Range("[-1, 1]")] = 0.0
    # no split before this many rounds (the joint model first approaches its optimum)
    warmup_rounds: Annotated[int, Range(">= 0"), Most(1_000_000, "rounds")] = 5
    min_size: Annotated[
        int, Range(">= 1", note="clients on each side of a split"), Most(1_000_000, "clients")
    ] = 2
    max_clusters: Annotated[int, Range(">= 1"), Most(MAX_CLUSTERS, "clusters")] = 8
    # two clusters whose models are within this relative distance
    # ||w_a - w_b|| / max(||w_a||, ||w_b||) become one; 0: never merged
    merge_below: Annotated[float, Range(">= 0", note="0: never")] = 0.01


@dataclass(frozen=True)
class IfcaOptions:
    """IFCA (Ghosh, Chung, Yin, Ramchandran 2020): ``clusters`` models; each client
    trains the one with the lowest loss on its data."""

    clusters: Annotated[int, Range(">= 1"), Most(MAX_CLUSTERS, "clusters")] = 2
    merge_below: Annotated[float, Range(">= 0", note="0: never")] = 0.01

"""How much the index sets of a round's sparsified uploads overlap (a round
diagnostic of ``diagnostics.updates`` with a ``topk`` or ``randk`` uplink).

An upload's index set S_i is the coordinates at which its decoded update is
non-zero: a top-k upload's kept coordinates (Aji & Heafield 2017), less any it
kept at exactly 0. The round counts, per coordinate j, the accepted uploads that
keep it, h_j = #{i : j in S_i}: one int32 array of the model's size, one add per
upload, summed across Ray workers as the aggregate is, so no upload is held
where the aggregation streams. From h alone, over the K uploads of sizes
|S_i| (k for every top-k upload) and the P coordinates an upload can carry
(the model's, less those each client keeps for itself: FedBN's, ``local_params``):

- ``kept_mean``: the mean |S_i|, k-bar = sum_j h_j / K;
- ``pair_overlap``: the mean over pairs i < j of |S_i & S_j|, over k-bar.
  sum_{i<j} |S_i & S_j| = sum_j C(h_j, 2) (a coordinate kept by h_j uploads is
  in C(h_j, 2) of the pairs' intersections), so

      pair_overlap = sum_j h_j (h_j - 1) / (K (K - 1) k-bar).

  With top-k it is the mean share of one client's k coordinates that another
  client keeps too: 1 when all keep the same set, 0 when the sets are disjoint;
- ``chance``: k-bar / P, what ``pair_overlap`` is on average for sets of k-bar
  coordinates drawn uniformly and independently (``randk`` per client): a top-k
  overlap far above it says the clients agree on where the update is large;
- ``union_fraction``: #{j : h_j >= 1} / P, the coordinates the aggregate can be
  non-zero at (its density: what a sparse downlink of it would carry);
- ``common_fraction``: #{j : h_j = K} / P, the coordinates every upload keeps.

The mean pairwise Jaccard index |S_i & S_j| / |S_i | S_j| is not a function of
h (each pair's intersection would be needed: every index set held); for two
sets of k coordinates whose overlap is o it is o / (2 - o), so a pair overlap
of 0.5 is a Jaccard index of 1/3. Fewer than two uploads, or none keeping a
coordinate: no pair figures (None; no upload: no figures but the count).
"""

from __future__ import annotations

from typing import Any

import torch

SPARSE_UPLINKS = ("topk", "randk")  # the codecs whose uploads carry an index set

COLUMNS = ("clients", "kept_mean", "pair_overlap", "chance", "union_fraction", "common_fraction")


class IndexOverlap:
    """Per coordinate, how many of a round's accepted uploads keep it."""

    def __init__(self, size: int, sendable: int | None = None) -> None:
        self.hits = torch.zeros(size, dtype=torch.int32)
        self.clients = 0
        # the coordinates an upload can carry: the fractions' denominator (fewer
        # than ``size`` where the clients keep some entries: communication/shared.py)
        self.sendable = size if sendable is None else sendable

    def add(self, delta: torch.Tensor) -> None:
        """Count one upload's index set: its decoded update's non-zero coordinates."""
        self.hits.add_((delta.reshape(-1) != 0).to(torch.int32))
        self.clients += 1

    def merge(self, other: IndexOverlap) -> None:
        """Add the uploads ``other`` counted (a Ray worker's)."""
        self.hits.add_(other.hits)
        self.clients += other.clients

    def figures(self) -> dict[str, Any]:
        """The round's figures of the module docstring, by name (None: undefined)."""
        k, size = self.clients, self.sendable
        h = self.hits.to(torch.float64)
        kept = float(h.sum()) / k if k else None
        pairs = None
        if k >= 2 and kept:
            pairs = float((h * (h - 1)).sum()) / (k * (k - 1) * kept)
        return {
            "clients": k,
            "kept_mean": kept,
            "pair_overlap": pairs,
            "chance": kept / size if kept is not None and size else None,
            "union_fraction": float((self.hits > 0).sum()) / size if k and size else None,
            "common_fraction": float((self.hits == k).sum()) / size if k and size else None,
        }

    def row(self, round_idx: int) -> tuple[Any, ...]:
        """The round's row of the run store's ``index_overlap`` table."""
        figures = self.figures()
        return (round_idx, *(figures[c] for c in COLUMNS))

"""The client groups of hierarchical aggregation (Liu et al. 2020, "Client-edge-cloud
hierarchical federated learning"): each group's edge aggregates its clients'
updates before the server (``fedforge.server.collectors.hierarchical``).

``contiguous`` gives client c the group floor(c G / N) (neighbouring ids, like a
site's devices); ``label`` gives it its majority label mod G (clients alike in
data share an edge).
"""

from __future__ import annotations

import numpy as np

from fedforge.data import Partition


def assign_groups(kind: str, groups: int, partition: Partition, labels: np.ndarray) -> list[int]:
    """The group id of every client (``groups`` >= 1)."""
    n = partition.num_clients
    if kind == "contiguous":
        return [c * groups // n for c in range(n)]
    if kind == "label":
        out = []
        for idx in partition.client_indices:
            counts = np.bincount(labels[idx]) if len(idx) else np.zeros(1, dtype=np.int64)
            out.append(int(np.argmax(counts)) % groups)
        return out
    raise ValueError(f"group_by {kind!r}; allowed: contiguous, label")

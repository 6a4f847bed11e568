"""Concept-shift partitions: the same input, different labels across clients.

Clients fall into ``G`` groups; each group sees the labels through its own map, a
permutation of the classes (group 0 the identity, so the test set is group 0's
task). One model cannot fit two groups at once: the same digit is class 3 for
one and class 7 for another. This is the constructed population of clustered
federated learning (Sattler, Mueller, Samek 2020, "Clustered Federated
Learning", label swaps over client groups; Ghosh et al. 2020, IFCA, its
relabelled MNIST), where a model per group is the remedy and FedAvg's one model
is not.

- A group's map, for g >= 1, is a derangement of the C classes (no class keeps
  its label: the groups conflict on every class) drawn from
  (seed, "concept-shift", g), redrawn until it differs from every earlier map.
- Groups are dealt over clients in a balanced way: a permutation of the clients
  from (seed, "concept-shift") cut in turn over the groups (floor(N / G) or
  ceil(N / G) clients each).
- The map is applied to every example the client holds, so its held-out slice
  (``evaluation.clients``) is in its group's labelling too; the test set stays
  as it is.

Runs on the simulation host, once per run, before any round.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedforge.core.errors import PartitionError
from fedforge.core.rng import numpy_rng
from fedforge.data.partition import Partition

MAX_GROUPS = 10  # at most one map a class of MNIST
_DRAWS = 1000  # derangements tried per map (about 1 in e permutations is one)


def label_maps(
    groups: int, num_classes: int, seed: int, stream: str = "concept-shift"
) -> np.ndarray:
    """``[groups, C]``: row g maps a true label to group g's label; row 0 is the
    identity, the others distinct derangements, map g drawn from (seed,
    ``stream``, g) (a drift's maps come from their own stream, data/drift.py)."""
    if groups < 1 or num_classes < 2:
        raise PartitionError(
            f"concept shift needs >= 1 group and >= 2 classes, got {groups} and {num_classes}"
        )
    maps = [np.arange(num_classes)]
    for g in range(1, groups):
        rng = numpy_rng(seed, stream, g)
        for _ in range(_DRAWS):
            p = rng.permutation(num_classes)
            if (p != np.arange(num_classes)).all() and not any((p == m).all() for m in maps):
                maps.append(p)
                break
        else:
            raise PartitionError(f"no {groups} distinct label maps of {num_classes} classes")
    return np.stack(maps).astype(np.int64)


def assign_groups(num_clients: int, groups: int, seed: int) -> tuple[int, ...]:
    """Each client's group: a permutation from (seed, "concept-shift") dealt over
    the ``groups`` in turn (balanced to within one client)."""
    order = numpy_rng(seed, "concept-shift").permutation(num_clients)
    out = [0] * num_clients
    for rank, client_id in enumerate(order.tolist()):
        out[client_id] = rank % groups
    return tuple(out)


def relabel(
    train_y: torch.Tensor, partition: Partition, client_groups: Sequence[int], maps: np.ndarray
) -> torch.Tensor:
    """A copy of ``train_y`` with each client's rows seen through its group's map
    (rows no client holds stay as they are). Clients' index sets must not overlap."""
    if len(client_groups) != partition.num_clients:
        raise PartitionError(
            f"{len(client_groups)} groups for {partition.num_clients} clients: need one each"
        )
    if train_y.dim() != 1 or train_y.is_floating_point():
        raise PartitionError("concept shift needs one class id a row")
    held = np.concatenate([*partition.client_indices, np.empty(0, dtype=np.int64)])
    if np.unique(held).size != held.size:
        raise PartitionError("concept shift needs clients whose examples do not overlap")
    out = train_y.clone()
    table = torch.from_numpy(maps)
    for idx, g in zip(partition.client_indices, client_groups, strict=True):
        if len(idx) == 0:
            continue
        rows = torch.from_numpy(np.array(idx, dtype=np.int64))
        out[rows] = table[g][train_y[rows].long()].to(out.dtype)
    return out

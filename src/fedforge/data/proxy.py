"""A proxy set carved from a partitioned training set, and its rows given to the
clients short of classes (Zhao et al. 2018, "Federated Learning with Non-IID
Data", section 4: a small globally shared subset against label skew). Pure
index arithmetic on the partition: the rows themselves stay where they are.

:func:`carve` draws a class-balanced sample of the rows the clients hold, from
the seed alone, and takes those rows out of every client's lists (its training
list and its held-out slice), so no client holds a proxy row and the test set,
a separate array, is never touched. :func:`fill` gives each client whose label
histogram lacks classes the proxy's rows of those classes.
"""

from __future__ import annotations

import numpy as np

from fedforge.core.errors import ConfigError
from fedforge.core.rng import numpy_rng
from fedforge.data.partition import Partition


def class_quota(size: int, classes: int) -> np.ndarray:
    """Rows of each class in a proxy set of ``size``: ``size // classes`` each, the
    first ``size % classes`` classes one more."""
    quota = np.full(classes, size // classes, dtype=np.int64)
    quota[: size % classes] += 1
    return quota


def carve(
    partition: Partition,
    holdout: Partition | None,
    labels: np.ndarray,
    size: int,
    classes: int,
    seed: int,
) -> tuple[Partition, Partition | None, np.ndarray]:
    """The partition and held-out slices less a class-balanced sample of ``size``
    of the rows they hold (drawn by ``numpy_rng(seed, "proxy")``), and the
    sample's row numbers, class by class, ascending within a class."""
    lists = [np.asarray(i) for i in partition.client_indices]
    held = [np.asarray(i) for i in holdout.client_indices] if holdout is not None else []
    pool = np.unique(np.concatenate([*lists, *held, np.zeros(0, dtype=np.int64)]))
    quota = class_quota(size, classes)
    rng = numpy_rng(seed, "proxy")
    picked = []
    for c in range(classes):
        rows = pool[labels[pool] == c]
        if len(rows) < quota[c]:
            raise ConfigError(
                f"config field 'proxy.size' = {size} is invalid: class {c} has {len(rows)} "
                f"rows among the clients', the proxy set needs {quota[c]} of each class"
            )
        picked.append(np.sort(rng.choice(rows, size=int(quota[c]), replace=False)))
    proxy = np.concatenate([*picked, np.zeros(0, dtype=np.int64)]).astype(np.int64)

    def without(idx: list[np.ndarray]) -> Partition:
        return Partition([i[~np.isin(i, proxy)] for i in idx])

    return without(lists), without(held) if holdout is not None else None, proxy


def missing_classes(labels: np.ndarray, classes: int) -> np.ndarray:
    """The classes a label histogram (of ``labels``) holds no row of."""
    return np.flatnonzero(np.bincount(labels, minlength=classes)[:classes] == 0)


def fill(
    partition: Partition, labels: np.ndarray, proxy: np.ndarray, classes: int, per_class: int
) -> tuple[Partition, list[np.ndarray]]:
    """Each client's list with the proxy's rows of the classes its histogram
    lacks appended (the first ``per_class`` of each, 0: all), and the rows each
    client was given (empty for a client lacking none)."""
    of_class = [proxy[labels[proxy] == c] for c in range(classes)]
    if per_class > 0:
        of_class = [rows[:per_class] for rows in of_class]
    lists, given = [], []
    for idx in partition.client_indices:
        idx = np.asarray(idx)
        lack = missing_classes(labels[idx], classes)
        add = np.concatenate([np.zeros(0, dtype=np.int64), *(of_class[c] for c in lack)])
        lists.append(np.concatenate([idx, add]))
        given.append(add)
    return Partition(lists), given

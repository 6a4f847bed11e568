"""Label-noise partitions: a fraction of the clients hold wrongly labelled data.

Noisy clients are the ``round(fraction * num_clients)`` ids drawn without
replacement from (seed, "label-noise"), fixed for the run. Of each noisy client's
examples, exactly ``round(rate * n)`` (drawn from (seed, "label-noise", client))
are relabelled by one of two rules, the two synthetic noise models of the
noisy-label literature:

- ``symmetric`` (default): the label becomes a class drawn uniformly from the
  other C - 1 classes, y -> (y + r) mod C with r uniform in 1..C-1. Symmetric
  (uniform) noise is the model of the federated noisy-client studies, e.g.
  FedCorr (Xu et al., CVPR 2022), and of the centralised benchmarks it follows
  (Patrini et al. 2017; Han et al. 2018). At ``rate`` 1 every label is wrong and
  the client's data carries no information about the task.
- ``pair``: y -> (y + 1) mod C, pair flipping (Han et al., Co-teaching, NeurIPS
  2018): a systematic confusion of each class with the next, which a local model
  can learn.

Unlike the ``label_flip`` attack (fedforge.robust.attacks, c -> C - 1 - c, chosen by an
adversary), this is honest clients with bad annotation; the noisy labels are the
client's data, so its held-out slices carry them too. The ids of the noisy clients
are recorded with the partition (partition.json).

Runs on the simulation host, once per run, before any round.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from fedforge.core.errors import PartitionError
from fedforge.core.rng import numpy_rng
from fedforge.data.partition import Partition

RULES = ("symmetric", "pair")


def noisy_client_ids(num_clients: int, fraction: float, seed: int) -> tuple[int, ...]:
    """The sorted ids of the ``round(fraction * num_clients)`` noisy clients."""
    if not 0.0 <= fraction <= 1.0:
        raise PartitionError(f"label-noise fraction {fraction!r} is invalid: must be in [0, 1]")
    count = round(fraction * num_clients)
    rng = numpy_rng(seed, "label-noise")
    return tuple(sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False)))


def flip_labels(
    y: torch.Tensor, rule: str, rate: float, num_classes: int, rng: np.random.Generator
) -> torch.Tensor:
    """A copy of ``y`` with exactly ``round(rate * len(y))`` labels, chosen by ``rng``,
    relabelled by ``rule`` (see the module docstring)."""
    if rule not in RULES:
        raise PartitionError(
            f"label-noise rule {rule!r} is invalid: must be one of "
            + ", ".join(repr(r) for r in RULES)
        )
    if not 0.0 < rate <= 1.0:
        raise PartitionError(f"label-noise rate {rate!r} is invalid: must be in (0, 1]")
    if num_classes < 2:
        raise PartitionError(f"label noise needs at least 2 classes, got {num_classes}")
    out = y.clone()
    n = len(y)
    chosen = torch.from_numpy(rng.permutation(n)[: round(rate * n)].astype(np.int64))
    if rule == "pair":
        shift = torch.ones(len(chosen), dtype=y.dtype)
    else:
        shift = torch.from_numpy(rng.integers(1, num_classes, size=len(chosen))).to(y.dtype)
    out[chosen] = (y[chosen] + shift) % num_classes
    return out


def noisy_labels(
    train_y: torch.Tensor,
    partition: Partition,
    noisy: Iterable[int],
    rule: str,
    rate: float,
    num_classes: int,
    seed: int,
) -> torch.Tensor:
    """A copy of ``train_y`` whose noisy clients' labels are relabelled."""
    out = train_y.clone()
    for client_id in noisy:
        idx = partition.client_indices[client_id]
        if len(idx) == 0:
            continue
        rows = torch.from_numpy(np.array(idx, dtype=np.int64))
        rng = numpy_rng(seed, "label-noise", client_id)
        out[rows] = flip_labels(train_y[rows], rule, rate, num_classes, rng)
    return out

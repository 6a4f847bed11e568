"""A validation split carved from the training data, for choosing settings
without reading the test set (``evaluation.validation``: its fraction).

``per_client``: each client gives up round(f n_k) of its own examples (at least
one when it holds two or more, never all), drawn from (seed, "validation",
client id): every client's distribution is represented in proportion to its
size. ``central``: round(f n) examples drawn uniformly from the pooled training
set by (seed, "validation"), taken from whichever clients held them: the
server's own labelled set. Either way the validation rows leave the clients'
training indices, depend only on the seed and the partition (a rerun carves the
same ones), and the server scores the global model on them at every evaluation;
a run's target (``target_accuracy``) and the benchmarks' rounds to target then
read the validation accuracy, the test set giving only the reported number.
"""

from __future__ import annotations

import numpy as np

from fedforge.core.rng import numpy_rng
from fedforge.data.partition import Partition
from fedforge.evaluation.evaluate import EvalResult

KEY = "validation"  # the purpose key of the split's draws (core/rng.py)
VALIDATION_ACCURACY = "validation_accuracy"  # its row of the run store's eval_metrics


def carve_validation(
    partition: Partition, fraction: float, split: str, seed: int
) -> tuple[Partition, np.ndarray]:
    """The clients' indices without the validation rows, and the validation rows
    (sorted indices into the training set)."""
    clients = partition.client_indices
    if split == "central":
        parts = [np.asarray(i, dtype=np.int64) for i in clients]
        pooled = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        k = round(fraction * len(pooled))
        held = np.sort(pooled[numpy_rng(seed, KEY).permutation(len(pooled))[:k]])
        keep = tuple(np.sort(np.setdiff1d(i, held)) for i in clients)
        return Partition(keep), held.astype(np.int64)
    kept, taken = [], []
    for client_id, idx in enumerate(clients):
        n = len(idx)
        k = min(max(round(fraction * n), 1), n - 1) if n >= 2 else 0
        perm = numpy_rng(seed, KEY, client_id).permutation(n)
        taken.append(idx[perm[:k]])
        kept.append(np.sort(idx[perm[k:]]))
    held = np.sort(np.concatenate(taken)) if taken else np.zeros(0, dtype=np.int64)
    return Partition(tuple(kept)), held.astype(np.int64)


def validation_figures(scores: EvalResult) -> dict[str, float]:
    """The validation scores as the run store's ``eval_metrics`` rows name them."""
    return {VALIDATION_ACCURACY: scores.accuracy, "validation_loss": scores.loss}

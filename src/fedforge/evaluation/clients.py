"""Per-client evaluation: how the global model does on each client, and how
fairly.

With ``evaluation.clients: true`` each client's partition loses a held-out slice
(``evaluation.holdout`` of its examples, at least one when it has two or more, drawn
from (seed, "eval-holdout", client); the rest is what it trains on). Every
evaluation round the global model -- for FedBN with the client's own batch norm
over it (``Algorithm.personal``) -- is evaluated on every client's slice, and on
the test set class by class. The figures:

- per-client accuracy: mean, population std, 10th percentile (numpy's linear
  interpolation), the 10 worst clients with their ids;
- fairness: Jain's index (sum a)^2 / (n sum a^2) (1 when all are equal, 1/n when
  one client has everything) and the population variance of the accuracies;
- per-class accuracy of the global model on the test set.

Runs on the server in simulation (it reads the clients' held-out slices);
trusts the data it is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedforge.algorithms.base import Algorithm
from fedforge.config import Config
from fedforge.core.device import module_device
from fedforge.core.params import ParamSpec
from fedforge.core.rng import numpy_rng
from fedforge.data import Partition
from fedforge.data.federated import FederatedData
from fedforge.evaluation.evaluate import evaluate
from fedforge.evaluation.participation import jain_index
from fedforge.tasks.metrics import Metrics


class EvaluatedRun(Protocol):
    """What evaluating a run's clients reads of it (a built run has it all)."""

    cfg: Config
    data: FederatedData
    model: nn.Module
    spec: ParamSpec
    algorithm: Algorithm
    metrics: Metrics  # the task's

    def client_train_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]: ...


WORST = 10  # clients listed by name in the summary


def split_holdout(partition: Partition, fraction: float, seed: int) -> tuple[Partition, Partition]:
    """Each client's indices as (kept for training, held out): ``round(fraction * n)``
    held out, at least 1 when n >= 2 and never all; deterministic in ``seed``."""
    keep: list[np.ndarray] = []
    held: list[np.ndarray] = []
    for client_id, idx in enumerate(partition.client_indices):
        n = len(idx)
        k = min(max(round(fraction * n), 1), n - 1) if n >= 2 else 0
        perm = numpy_rng(seed, "eval-holdout", client_id).permutation(n)
        held.append(np.sort(idx[perm[:k]]))
        keep.append(np.sort(idx[perm[k:]]))
    return Partition(tuple(keep)), Partition(tuple(held))


@dataclass(frozen=True)
class ClientEvalSummary:
    """The distribution of per-client accuracy in one evaluation round."""

    clients: int
    mean: float
    std: float
    p10: float
    variance: float
    jain: float
    worst: tuple[tuple[int, float], ...]  # (client id, accuracy), worst first

    def format(self) -> str:
        worst = ", ".join(f"{c}:{a:.3f}" for c, a in self.worst)
        return (
            f"mean {self.mean:.4f} std {self.std:.4f} p10 {self.p10:.4f} over {self.clients} "
            f"clients; Jain {self.jain:.4f}, variance {self.variance:.5f}; worst {worst}"
        )


def summarize_accuracies(accuracy: Mapping[int, float], worst: int = WORST) -> ClientEvalSummary:
    """The figures of one round from ``{client id: accuracy}``."""
    ids = sorted(accuracy)
    a = np.asarray([accuracy[c] for c in ids], dtype=np.float64)
    if len(a) == 0:
        nan = math.nan
        return ClientEvalSummary(0, nan, nan, nan, nan, 1.0, ())
    order = sorted(ids, key=lambda c: (accuracy[c], c))[:worst]
    return ClientEvalSummary(
        clients=len(a),
        mean=float(a.mean()),
        std=float(a.std()),
        p10=float(np.percentile(a, 10)),
        variance=float(a.var()),
        jain=jain_index(a.tolist()),
        worst=tuple((c, float(accuracy[c])) for c in order),
    )


def per_class_accuracy(
    model: nn.Module,
    spec: ParamSpec,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    batch_size: int = 250,
) -> list[tuple[int, float | None, int]]:
    """(class, accuracy or None when the class is absent, examples) for each
    class, computed on the model's device."""
    device = module_device(model)
    tensors = spec.views(params.to(device))
    model.eval()
    correct = torch.zeros(num_classes, dtype=torch.int64, device=device)
    total = torch.bincount(y, minlength=num_classes)[:num_classes]
    with torch.inference_mode():
        for s in range(0, len(y), batch_size):
            xb, yb = x[s : s + batch_size].to(device), y[s : s + batch_size].to(device)
            hit = functional_call(model, tensors, (xb,)).argmax(dim=1) == yb
            correct += torch.bincount(yb[hit], minlength=num_classes)[:num_classes]
    correct = correct.cpu()
    return [
        (c, int(correct[c]) / int(total[c]) if int(total[c]) else None, int(total[c]))
        for c in range(num_classes)
    ]


# (client id, its starting parameters) -> the parameters it is scored with
AdaptFn = Callable[[int, torch.Tensor], torch.Tensor]


def client_accuracies(
    exp: EvaluatedRun, params: torch.Tensor, adapt_fn: AdaptFn | None = None
) -> list[tuple[int, float, float, int]]:
    """(client, accuracy, loss, examples) of the global model on every client's
    held-out slice (with the client's own batch norm under FedBN, its cluster's
    model under a clustered algorithm); ``adapt_fn``:
    what each client makes of it first (personalised evaluation, personal.py)."""
    data, personal = exp.data, exp.algorithm.personal
    served = served_clusters(exp)
    rows = []
    for client_id in range(exp.cfg.num_clients):
        x, y = data.holdout_data(client_id)
        if len(y) == 0:
            continue
        own = personal.start(client_id, params) if personal is not None else params
        if served is not None:  # a clustered algorithm: the client's cluster's model
            own = served[1][served[0][client_id]]
        if adapt_fn is not None:
            own = adapt_fn(client_id, own)
        ev = evaluate(exp.model, exp.spec, own, x, y, exp.cfg.evaluation.batch_size, exp.metrics)
        rows.append((client_id, ev.accuracy, ev.loss, ev.num_examples))
    return rows


def training_losses(
    exp: EvaluatedRun, client_id: int, models: Sequence[torch.Tensor]
) -> list[float]:
    """The loss of each of ``models`` on ``client_id``'s training data."""
    x, y = exp.client_train_data(client_id)
    batch = exp.cfg.evaluation.batch_size
    return [evaluate(exp.model, exp.spec, m, x, y, batch, exp.metrics).loss for m in models]


def served_clusters(exp: EvaluatedRun) -> tuple[list[int], torch.Tensor] | None:
    """Under a clustered algorithm (``Algorithm.clusters``) that has run a round:
    each client's cluster (its own, or for a client not placed yet the one whose
    model has the lowest loss on its data) and the clusters' models; else None."""
    rule = exp.algorithm.clusters
    table = rule.table if rule is not None else None
    if table is None:
        return None
    losses_fn = partial(training_losses, exp)
    return [table.served(c, losses_fn) for c in range(exp.cfg.num_clients)], table.models

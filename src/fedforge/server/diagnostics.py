"""Drift diagnostics, logged every round, and the per-client
evaluation rows of an evaluation round (``fedforge.evaluation.clients``).

Per round, over the accepted updates d_1..d_K the server decoded (those the
aggregator took: after the checks and the cohort stages, e.g. a norm gate, and
none in a round skipped for too few):

- the mean pairwise cosine similarity. With u_i = d_i / ||d_i|| and s = sum u_i,
  ||s||^2 = sum_i ||u_i||^2 + sum_{i != j} u_i . u_j = K + sum_{i != j} cos_ij, so

      mean_{i != j} cos_ij = (||s||^2 - K) / (K (K - 1)).

  The round keeps only s (O(P) memory, one axpy per update, float64), streaming or
  gathered alike; :func:`mean_pairwise_cosine` is the normalised Gram product
  U U^T of a gathered ``[K, P]`` tensor, the reference the tests compare with.
  Zero updates have no direction and are left out; fewer than two: no figure.
  A warning is written once per run when it stays below ``low_cosine`` for
  ``low_cosine_rounds`` rounds in a row (the cohort's updates disagree: client
  drift);
- the update norms' median, max and max / median;
- with a sparsifying uplink (``topk``, ``randk``), how much the uploads' index
  sets overlap (``index_overlap.py``: one count per coordinate, O(P));
- per client: its local training loss (the mean over its local steps, as it
  reports) and the loss of the round's global model on its training data (with
  its own batch norm under FedBN), computed before it trains; the gap is
  global - local.

Under secure aggregation the server sees no individual update: no figures.
Runs on the server (in simulation it reads the cohort's data for the gap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedforge.evaluation.clients import client_accuracies, per_class_accuracy, served_clusters
from fedforge.evaluation.evaluate import evaluate
from fedforge.evaluation.groups import group_accuracies
from fedforge.evaluation.personal import personal_accuracies
from fedforge.report.progress import Progress
from fedforge.server.experiment import Experiment
from fedforge.server.index_overlap import SPARSE_UPLINKS, IndexOverlap


def mean_pairwise_cosine(updates: torch.Tensor) -> float | None:
    """Mean cosine similarity over pairs i != j of the non-zero rows of ``[K, P]``
    (one normalised Gram product); None with fewer than two."""
    norms = updates.norm(dim=1)
    u = updates[norms > 0] / norms[norms > 0].unsqueeze(1)
    k = u.shape[0]
    if k < 2:
        return None
    gram = u @ u.T
    return float((gram.sum() - gram.diagonal().sum()) / (k * (k - 1)))


class RoundDiagnostics:
    """One round's figures, fed one accepted update at a time."""

    def __init__(
        self,
        size: int,
        updates: bool = True,
        loss_gap: bool = False,
        overlap: bool = False,
        sendable: int | None = None,
    ) -> None:
        self.size, self.updates, self.loss_gap = size, updates, loss_gap
        self.counts_overlap = overlap
        self.sendable = sendable  # the entries an upload can carry (None: all)
        self.global_loss: dict[int, float] = {}
        self.clear()

    def clear(self) -> None:
        """Forget the updates added so far (the round accepted none of them)."""
        self.direction_sum = torch.zeros(self.size, dtype=torch.float64)  # s = sum of u_i
        self.directions = 0
        self.norms: list[float] = []
        self.train_loss: dict[int, float] = {}
        # the uploads' index sets (a sparsifying uplink)
        self.overlap = IndexOverlap(self.size, self.sendable) if self.counts_overlap else None

    def before(self, exp: Experiment, client_ids: Sequence[int], params: torch.Tensor) -> None:
        """The global model's loss on each cohort client's training data (what it
        trains on: less held-out slices), before it trains."""
        personal = exp.algorithm.personal
        for c in client_ids:
            x, y = exp.client_train_data(c)
            if len(y) == 0:
                continue
            own = personal.start(c, params) if personal is not None else params
            ev = evaluate(
                exp.model, exp.spec, own, x, y, exp.cfg.evaluation.batch_size, exp.metrics
            )
            self.global_loss[c] = ev.loss

    def add(self, client_id: int, delta: torch.Tensor, train_loss: float) -> None:
        norm = float(delta.norm())
        self.norms.append(norm)
        if norm > 0 and math.isfinite(norm):
            self.direction_sum.add_(delta.to(torch.float64), alpha=1.0 / norm)
            self.directions += 1
        if self.overlap is not None:
            self.overlap.add(delta)
        self.train_loss[client_id] = train_loss

    def merge(self, other: RoundDiagnostics) -> None:
        """Add the updates ``other`` was fed (a worker's, partial.py)."""
        self.direction_sum.add_(other.direction_sum)
        self.directions += other.directions
        self.norms.extend(other.norms)
        self.train_loss.update(other.train_loss)
        if self.overlap is not None and other.overlap is not None:
            self.overlap.merge(other.overlap)

    @property
    def mean_cosine(self) -> float | None:
        k = self.directions
        if k < 2:
            return None
        s2 = float(self.direction_sum.dot(self.direction_sum))
        return (s2 - k) / (k * (k - 1))

    def rows(self, round_idx: int) -> dict[str, list[tuple[Any, ...]]]:
        """Rows of the run store's ``diagnostics`` and ``client_gaps`` tables."""
        norms = np.asarray(self.norms, dtype=np.float64)
        median = float(np.median(norms)) if len(norms) else None
        top = float(norms.max()) if len(norms) else None
        ratio = top / median if median and top is not None else None
        out: dict[str, list[tuple[Any, ...]]] = {}
        if self.updates:
            out["diagnostics"] = [(round_idx, len(norms), self.mean_cosine, median, top, ratio)]
        if self.overlap is not None:
            out["index_overlap"] = [self.overlap.row(round_idx)]
        if not self.loss_gap:
            return out
        gaps = []
        for c, local in sorted(self.train_loss.items()):
            glob = self.global_loss.get(c)
            gap = glob - local if glob is not None else None
            gaps.append((round_idx, c, local, glob, gap))
        if gaps:
            out["client_gaps"] = gaps
        return out

    def warn(
        self, state: dict[str, Any], bar: Progress, round_idx: int, low: float, rounds: int
    ) -> None:
        """Count rounds in a row below ``low``; warn once per run after ``rounds``."""
        cos = self.mean_cosine
        if cos is None:
            return
        streak = int(state.get("low_streak", 0)) + 1 if cos < low else 0
        state["low_streak"] = streak
        if streak >= rounds and not state.get("warned", False):
            state["warned"] = True
            bar.write(
                f"round {round_idx + 1}: warning: the mean pairwise cosine of the cohort's updates "
                f"has been below {low} for {streak} rounds (now {cos:.3f}): clients drift apart"
            )


def start_round(
    exp: Experiment, client_ids: Sequence[int], params: torch.Tensor, secure: bool
) -> RoundDiagnostics | None:
    """The round's diagnostics (None when off or under secure aggregation), with the
    global model's loss on the cohort's data taken before the clients train."""
    cfg = exp.cfg.diagnostics
    if not (cfg.updates or cfg.loss_gap) or secure:
        return None
    sparse = exp.cfg.communication.uplink in SPARSE_UPLINKS
    personal = exp.algorithm.personal  # entries the clients keep are never sent
    sendable = exp.spec.size - (0 if personal is None else int(personal.mask.sum()))
    diag = RoundDiagnostics(
        exp.spec.size, cfg.updates, cfg.loss_gap, cfg.updates and sparse, sendable
    )
    if cfg.loss_gap:
        diag.before(exp, client_ids, params)
    return diag


def end_round(
    exp: Experiment,
    diag: RoundDiagnostics | None,
    state: dict[str, Any],
    outputs: dict[str, list[tuple[Any, ...]]],
    bar: Progress,
    round_idx: int,
) -> None:
    """Put the round's rows into ``outputs`` and run the drift warning."""
    if diag is None:
        return
    outputs.update(diag.rows(round_idx))
    cfg = exp.cfg.diagnostics
    if cfg.updates:
        diag.warn(state, bar, round_idx, cfg.low_cosine, cfg.low_cosine_rounds)


def evaluation_rows(
    exp: Experiment, params: torch.Tensor, round_idx: int
) -> dict[str, list[tuple[Any, ...]]]:
    """Rows of ``client_eval`` (each client's held-out slice), ``class_accuracy``
    (the global model on the test set) and, with ``evaluation.personal.steps``,
    the ``personal_eval`` table (each client's slice after its local steps, personal.py)
    and, when clients carry tags, ``group_eval`` (each group's, groups.py) for an
    evaluation round."""
    data = exp.data
    classes = data.classes()
    per_class = []  # rows of one class id each only
    if classes is not None and data.test_y.dim() == 1:
        per_class = per_class_accuracy(
            exp.model,
            exp.spec,
            params,
            data.test_x,
            data.test_y,
            classes,
            exp.cfg.evaluation.batch_size,
        )
    clients = client_accuracies(exp, params)
    rows: dict[str, list[tuple[Any, ...]]] = {
        "client_eval": [(round_idx, *row) for row in clients],
        "class_accuracy": [(round_idx, *row) for row in per_class],
    }
    tags = dict(data.client_tags())
    served = served_clusters(exp)
    if served is not None:  # a clustered algorithm: each cluster's clients
        tags["cluster"] = tuple(f"c{j}" for j in served[0])
    if tags:  # each population group of clients (evaluation/groups.py)
        rows["group_eval"] = [(round_idx, *row) for row in group_accuracies(tags, clients)]
    if exp.cfg.evaluation.personal.steps > 0:  # each client after its own local steps
        rows["personal_eval"] = [
            (round_idx, *r) for r in personal_accuracies(exp, params, round_idx)
        ]
    return rows

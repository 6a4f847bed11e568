"""What the tests of named stages and metrics share (test_named_stages.py,
test_named_metrics.py): the examples loaded as ``--plugin`` loads them, stages of
the tests' own, a float64 logistic regression over three clients, and one round
of it worked in plain torch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fedforge
from examples_loaded import load_example
from fedforge.config import from_dict
from fedforge.core import registry
from fedforge.data.federated import FederatedData
from fedforge.data.partition import Partition
from fedforge.pipeline.pipeline import CohortUpdates, StageContext
from fedforge.store import RunStore

F64 = torch.float64
D, C = 3, 4  # features, classes of the logistic regression
SIZES = (2, 3, 4)  # examples a client
LR, EPOCHS = 0.5, 2
BOUNDS = np.cumsum([0, *SIZES])
PARTS = tuple(np.arange(BOUNDS[k], BOUNDS[k + 1]) for k in range(len(SIZES)))
NO_GATES = {"max_norm_multiple": None, "max_update_ratio": None}


class Halve:
    """A server stage on the aggregate: aggregate / 2."""

    name, where, role, linear, constraints = "halve", "server_aggregate", "other", True, ()

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        return vec / 2


class Negate:
    """A server stage on each upload."""

    name, where, role, linear, constraints = "negate", "server_upload", "other", True, ()

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        return -vec


class Square:
    """A server stage on each upload that is not linear."""

    name, where, role, linear, constraints = "square", "server_upload", "other", False, ()

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        return vec * vec.abs()


class DropFirst:
    """A cohort stage refusing the first row."""

    name, where, role, constraints = "drop_first", "server_cohort", "gate", ()

    def apply(
        self, cohort: CohortUpdates, ctx: StageContext
    ) -> tuple[CohortUpdates, list[tuple[int, str]]]:
        keep = CohortUpdates(cohort.client_ids[1:], cohort.updates[1:], cohort.weights[1:])
        return keep, [(cohort.client_ids[0], "first")]


class Shrink:
    """A cohort stage that rewrites every row (role 'other')."""

    name, where, role, constraints = "shrink", "server_cohort", "other", ()

    def apply(
        self, cohort: CohortUpdates, ctx: StageContext
    ) -> tuple[CohortUpdates, list[tuple[int, str]]]:
        rows = CohortUpdates(cohort.client_ids, cohort.updates / 2, cohort.weights)
        return rows, []


class Halves:
    """A client stage returning half-precision: another kind of vector."""

    name, where, role, linear, constraints = "to_half", "client", "other", True, ()

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        return vec.half()


OURS = {
    "halve": Halve,
    "negate": Negate,
    "square": Square,
    "drop_first": DropFirst,
    "shrink": Shrink,
    "to_half": Halves,
}


@pytest.fixture(scope="module")
def examples() -> Iterator[dict[str, Any]]:
    """The examples, loaded once a process as ``--plugin`` loads them (they stay
    registered, as a plugin does), and the tests' own stages for the module."""
    loaded = {n: load_example(n) for n in ("layer_clip", "macro_f1")}
    for name, cls in OURS.items():
        fedforge.register_stage(name, lambda context, cls=cls: cls(), replace=True)
    yield loaded
    for name in OURS:
        registry.unregister("stage", name)


def tiny_data() -> FederatedData:
    gen = torch.Generator().manual_seed(11)
    n = sum(SIZES)
    x = torch.randn(n, D, generator=gen, dtype=F64) * 3
    y = torch.tensor([0, 1, 1, 0, 2, 2, 1, 0, 2])
    return FederatedData(x, y, x, y, Partition(PARTS), num_classes=C)


def config_for(tmp_path: Path, engine: str = "serial", **extra: Any) -> fedforge.Config:
    fields = {
        "dataset": "synthetic",
        "model": "logreg",
        "num_clients": len(SIZES),
        "client_fraction": 1.0,
        "local_epochs": EPOCHS,
        "batch_size": None,  # full batch: local SGD is gradient descent, worked below
        "lr": LR,
        "rounds": 1,
        "target_accuracy": None,
        "dtype": "float64",
        "engine": engine,
        "evaluation": {"batch_size": 4},  # the test set in three batches
        "robust": NO_GATES,
        "runs_dir": str(tmp_path / engine),
        **extra,
    }
    return from_dict(fields)


def logits(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    weight, bias = w[: C * D].view(C, D), w[C * D :]
    return x @ weight.T + bias


def local(w0: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """EPOCHS full-batch gradient steps of size LR from w0."""
    w = w0.clone()
    for _ in range(EPOCHS):
        leaf = w.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(logits(leaf, x), y), leaf)
        w = w - LR * grad
    return w


def clip_layers(delta: torch.Tensor, norm: float) -> torch.Tensor:
    """The weight [C, D] and the bias [C], each scaled to L2 norm at most ``norm``."""
    parts = [delta[: C * D], delta[C * D :]]
    return torch.cat([p * min(1.0, norm / float(p.norm())) for p in parts])


def one_round(w0: torch.Tensor, data: FederatedData, norm: float) -> torch.Tensor:
    """The example-weighted mean of the clients' per-layer clipped deltas, applied."""
    deltas = []
    for idx in PARTS:
        deltas.append(clip_layers(local(w0, data.train_x[idx], data.train_y[idx]) - w0, norm))
    weights = torch.tensor(SIZES, dtype=F64)
    return w0 + (weights @ torch.stack(deltas)) / weights.sum()


def initial(tmp_path: Path, data: FederatedData) -> torch.Tensor:
    return fedforge.build(config_for(tmp_path), data=data).initial_params.clone()


NORM = 0.3
CLIPPED = {"pipeline": {"client": ["layer_clip"]}, "plugin_options": {"layer_clip": {"norm": NORM}}}


def metric_rows(result: fedforge.RunResult) -> list[tuple[Any, ...]]:
    """The run store's eval_metrics rows of ``result``."""
    assert result.run_dir is not None
    with RunStore.open(result.run_dir, read_only=True) as store:
        return store.read_rows("eval_metrics")

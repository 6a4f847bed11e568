"""Stages and metrics a config names (``pipeline.client``, ``pipeline.server``,
``metrics``): the examples per-layer clipping and macro-F1 (examples/*.py, on
the public API) against one round and one confusion matrix worked by hand in
plain torch (float64), on the serial and the vectorised engine; reruns
bit-identical; and the one-line refusals of what a stage cannot do (under secure
aggregation, between the clip and central DP noise, on the wrong side, returning
another kind of vector than it was given)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fedforge
from fedforge.config import from_dict
from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.data.federated import FederatedData
from fedforge.data.partition import Partition
from fedforge.pipeline.pipeline import CohortUpdates, StageContext
from fedforge.store import RunStore

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
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
    loaded = {
        n: sys.modules[fedforge.load_plugin(str(EXAMPLES / f"{n}.py"))]
        for n in ("layer_clip", "macro_f1")
    }
    for name, cls in OURS.items():
        fedforge.register_stage(name, lambda context, cls=cls: cls())
    yield loaded
    for kind, name in [("stage", "layer_clip"), ("metric", "macro_f1")] + [
        ("stage", n) for n in OURS
    ]:
        registry.unregister(kind, name)


def _data() -> FederatedData:
    gen = torch.Generator().manual_seed(11)
    n = sum(SIZES)
    x = torch.randn(n, D, generator=gen, dtype=F64) * 3
    y = torch.tensor([0, 1, 1, 0, 2, 2, 1, 0, 2])
    return FederatedData(x, y, x, y, Partition(PARTS), num_classes=C)


def _cfg(tmp_path: Path, engine: str = "serial", **extra: Any) -> fedforge.Config:
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
        "eval_batch_size": 4,  # the test set in three batches
        "robust": NO_GATES,
        "runs_dir": str(tmp_path / engine),
        **extra,
    }
    return from_dict(fields)


def _logits(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    weight, bias = w[: C * D].view(C, D), w[C * D :]
    return x @ weight.T + bias


def _local(w0: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """EPOCHS full-batch gradient steps of size LR from w0."""
    w = w0.clone()
    for _ in range(EPOCHS):
        leaf = w.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(_logits(leaf, x), y), leaf)
        w = w - LR * grad
    return w


def _clip_layers(delta: torch.Tensor, norm: float) -> torch.Tensor:
    """The weight [C, D] and the bias [C], each scaled to L2 norm at most ``norm``."""
    parts = [delta[: C * D], delta[C * D :]]
    return torch.cat([p * min(1.0, norm / float(p.norm())) for p in parts])


def _round(w0: torch.Tensor, data: FederatedData, norm: float) -> torch.Tensor:
    """The example-weighted mean of the clients' per-layer clipped deltas, applied."""
    deltas = []
    for idx in PARTS:
        deltas.append(_clip_layers(_local(w0, data.train_x[idx], data.train_y[idx]) - w0, norm))
    weights = torch.tensor(SIZES, dtype=F64)
    return w0 + (weights @ torch.stack(deltas)) / weights.sum()


def _initial(tmp_path: Path, data: FederatedData) -> torch.Tensor:
    return fedforge.build(_cfg(tmp_path), data=data).initial_params.clone()


NORM = 0.3
CLIPPED = {"pipeline": {"client": ["layer_clip"]}, "plugin_options": {"layer_clip": {"norm": NORM}}}


@pytest.mark.parametrize("engine", ["serial", "vectorized"])
def test_layer_clip_is_one_hand_worked_round(
    examples: dict[str, Any], tmp_path: Path, engine: str
) -> None:
    data = _data()
    w0 = _initial(tmp_path, data)
    expected = _round(w0, data, NORM)
    deltas = [_local(w0, data.train_x[i], data.train_y[i]) - w0 for i in PARTS]
    assert all(float(d[: C * D].norm()) > NORM for d in deltas)  # the clip bites
    cfg = _cfg(tmp_path, engine, **CLIPPED)
    assert fedforge.build(cfg, data=data).engine.name == engine  # no fallback
    result = fedforge.run(cfg, data=data)
    torch.testing.assert_close(result.params, expected, rtol=0, atol=1e-12)
    assert not result.rejected and not result.skipped


def test_server_stages_run_on_each_upload_and_on_the_aggregate(
    examples: dict[str, Any], tmp_path: Path
) -> None:
    """negate on every upload, then halve the mean: w0 - mean / 2."""
    data = _data()
    w0 = _initial(tmp_path, data)
    expected = w0 - (_round(w0, data, NORM) - w0) / 2
    server = {**CLIPPED, "pipeline": {"client": ["layer_clip"], "server": ["halve", "negate"]}}
    exp = fedforge.build(_cfg(tmp_path, **server), data=data)
    assert exp.pipeline.describe() == (
        "client: local_training -> layer_clip -> encode:dense | server: decode:dense -> "
        "negate -> weighted_mean -> halve -> server_optimizer"
    )
    result = fedforge.run(_cfg(tmp_path, **server), data=data)
    torch.testing.assert_close(result.params, expected, rtol=0, atol=1e-12)


def test_a_linear_upload_stage_runs_on_the_sum_under_secure_aggregation(
    examples: dict[str, Any], tmp_path: Path
) -> None:
    """negate on the unmasked sum: the same step as without the stage, reversed (to
    the fixed-point encoding's rounding)."""
    data = _data()
    w0 = _initial(tmp_path, data)
    masked = {"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}}
    plain = fedforge.run(_cfg(tmp_path / "plain", **masked), data=data)
    negated = fedforge.run(
        _cfg(tmp_path / "negated", pipeline={"server": ["negate"]}, **masked), data=data
    )
    assert float((plain.params - w0).norm()) > 0.1
    torch.testing.assert_close(negated.params - w0, -(plain.params - w0), rtol=0, atol=1e-6)


def test_a_cohort_stage_refuses_with_its_name(examples: dict[str, Any], tmp_path: Path) -> None:
    data = _data()
    result = fedforge.run(_cfg(tmp_path, pipeline={"server": ["drop_first"]}), data=data)
    assert [(r, c, why) for r, c, why in result.rejected] == [(0, 0, "drop_first: first")]


def _rows(result: fedforge.RunResult) -> list[tuple[Any, ...]]:
    """The run store's eval_metrics rows of ``result``."""
    assert result.run_dir is not None
    with RunStore.open(result.run_dir, read_only=True) as store:
        return store.read_rows("eval_metrics")


def _hand_macro_f1(labels: list[int], preds: list[int]) -> float:
    """Mean over the classes in labels or predictions of 2 TP / (2 TP + FP + FN)."""
    scores = []
    for c in sorted(set(labels) | set(preds)):
        tp = sum(1 for y, p in zip(labels, preds, strict=True) if y == c and p == c)
        fp = sum(1 for y, p in zip(labels, preds, strict=True) if y != c and p == c)
        fn = sum(1 for y, p in zip(labels, preds, strict=True) if y == c and p != c)
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores)


def test_macro_f1_by_hand(examples: dict[str, Any]) -> None:
    metric = examples["macro_f1"].MacroF1()
    labels = torch.tensor([0, 0, 1, 2])
    outputs = F.one_hot(torch.tensor([0, 1, 1, 1]), C).to(F64)  # predictions 0, 1, 1, 1
    # class 0: TP 1, FN 1 -> 2/3; class 1: TP 1, FP 2 -> 1/2; class 2: FN 1 -> 0;
    # class 3: neither labelled nor predicted, left out
    whole = metric.value(metric.batch(outputs, labels))
    assert whole == pytest.approx((2 / 3 + 1 / 2 + 0) / 3, abs=1e-15)
    split = metric.batch(outputs[:1], labels[:1]) + metric.batch(outputs[1:], labels[1:])
    assert metric.value(split) == whole


def test_named_metrics_are_recorded_at_each_evaluation(
    examples: dict[str, Any], tmp_path: Path
) -> None:
    data = _data()
    cfg = _cfg(tmp_path, rounds=2, metrics=["macro_f1", "accuracy"], **CLIPPED)
    result = fedforge.run(cfg, data=data)
    rows = _rows(result)
    assert [(r, name) for r, name, _ in rows] == [
        (0, "accuracy"),
        (0, "macro_f1"),
        (1, "accuracy"),
        (1, "macro_f1"),
    ]
    preds = _logits(result.params, data.test_x).argmax(dim=1).tolist()
    labels = data.test_y.tolist()
    figures = {name: value for r, name, value in rows if r == 1}
    assert figures["macro_f1"] == pytest.approx(_hand_macro_f1(labels, preds), abs=1e-12)
    hits = sum(p == y for p, y in zip(preds, labels, strict=True))
    assert figures["accuracy"] == pytest.approx(hits / len(labels), abs=1e-15)
    assert figures["accuracy"] == result.rounds[-1].test_accuracy  # the task's own


def test_named_stage_and_metric_reruns_are_bit_identical(
    examples: dict[str, Any], tmp_path: Path
) -> None:
    data = _data()
    extra = {**CLIPPED, "rounds": 2, "metrics": ["macro_f1"], "client_fraction": 0.67}
    runs = [fedforge.run(_cfg(tmp_path / str(i), **extra), data=data) for i in range(2)]
    assert torch.equal(runs[0].params, runs[1].params)
    stored = [_rows(r) for r in runs]
    assert stored[0] == stored[1]


def test_a_run_with_named_stages_and_metrics_resumes_exactly(
    examples: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed as round 3 of 3 starts (a checkpoint after each round), resumed: the
    uninterrupted run's parameters and metric rows, bit for bit."""
    from tests.conftest import wrap_engine

    from fedforge.engines import SimulationEngine

    class Killed(SimulationEngine):
        name = "killed"

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def run_cohort(self, tasks: Any, payload: bytes) -> Any:
            if tasks[0].round_idx == 2:
                raise MemoryError("killed (test)")
            return self.inner.run_cohort(tasks, payload)

    data = _data()
    extra = {
        **CLIPPED,
        "pipeline": {"client": ["layer_clip"], "server": ["halve"]},
        "rounds": 3,
        "checkpoint_every": 1,
        "metrics": ["macro_f1"],
        "client_fraction": 0.67,
    }
    want = fedforge.run(_cfg(tmp_path / "whole", **extra), data=data)
    cfg = _cfg(tmp_path / "killed", **extra)
    with monkeypatch.context() as patch:
        wrap_engine(patch, Killed)
        with pytest.raises(MemoryError):
            fedforge.run(cfg, data=data)
    (run_dir,) = Path(cfg.runs_dir).iterdir()
    got = fedforge.resume(run_dir, data=data)
    assert torch.equal(got.params, want.params)
    assert _rows(got) == _rows(want)


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (
            {"pipeline": {"client": ["halve"]}},
            "pipeline.client: stage 'halve' runs on 'server_aggregate'; pipeline.client takes "
            "stages that run on 'client' (name it under pipeline.server)",
        ),
        (
            {"pipeline": {"server": ["layer_clip"]}},
            "pipeline.server: stage 'layer_clip' runs on 'client'",
        ),
        (
            {"pipeline": {"server": ["drop_first"]}, "privacy": {"secagg": True}},
            "secure aggregation hides each update, so the per-upload/cohort gate 'drop_first' "
            "cannot see it (it needs the individual updates)",
        ),
        (
            {"pipeline": {"server": ["square"]}, "privacy": {"secagg": True}},
            "server upload stage 'square' is not linear: it cannot run on a sum",
        ),
        (
            {
                "pipeline": {"server": ["negate"]},
                "privacy": {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0},
            },
            "server upload stage 'negate' runs between 'clip' and 'central_dp': the noise is "
            "calibrated to the clipped norm",
        ),
        (
            {
                "pipeline": {"server": ["shrink"]},
                "privacy": {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0},
            },
            "cohort stage 'shrink' (role 'other': it may rewrite updates) runs between 'clip' "
            "and 'central_dp'",
        ),
        (
            {"pipeline": {"client": ["layer_clip", "layer_clip"]}},
            "config field 'pipeline.client' = ['layer_clip', 'layer_clip'] is invalid: names "
            "layer_clip more than once",
        ),
        ({"pipeline": {"client": ["nope"]}}, "config field 'pipeline.client' = 'nope'"),
        ({"metrics": ["nope"]}, "config field 'metrics' = 'nope' is invalid: must be a "),
    ],
)
def test_what_a_named_stage_cannot_do_is_refused_in_one_line(
    examples: dict[str, Any], tmp_path: Path, extra: dict[str, Any], line: str
) -> None:
    extra.setdefault("communication", {"clip_norm": 1.0})  # secure aggregation's bound
    if "privacy" in extra and extra["privacy"].get("dp") == "central":
        extra.pop("communication")
    with pytest.raises(ConfigError) as info:
        fedforge.build(_cfg(tmp_path, **extra), data=_data())
    assert line in str(info.value) and "\n" not in str(info.value)


def test_dp_noise_composes_with_stages_before_the_clip_and_on_the_noised_aggregate(
    examples: dict[str, Any], tmp_path: Path
) -> None:
    priv = {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0}
    extra = {
        **CLIPPED,
        "pipeline": {"client": ["layer_clip"], "server": ["halve", "drop_first"]},
        "privacy": priv,
    }
    exp = fedforge.build(_cfg(tmp_path, **extra), data=_data())
    assert exp.pipeline.describe() == (
        "client: local_training -> layer_clip -> clip -> encode:dense | server: "
        "decode:dense -> drop_first -> dp_mean -> central_dp -> halve -> server_optimizer"
    )


def test_a_stage_returning_another_kind_of_vector_is_refused(
    examples: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(
        ConfigError,
        match=r"client stage 'to_half' returned \(\d+,\) torch\."
        r"float16; a stage returns the update's \(\d+,\) torch\.float64",
    ):
        fedforge.run(_cfg(tmp_path, pipeline={"client": ["to_half"]}), data=_data())


def test_the_example_configs_read_with_their_plugins(examples: dict[str, Any]) -> None:
    import yaml

    from fedforge.config.components import check_names

    clip = from_dict(yaml.safe_load((EXAMPLES / "layer_clip.yaml").read_text()))
    f1 = from_dict(yaml.safe_load((EXAMPLES / "macro_f1.yaml").read_text()))
    for cfg in (clip, f1):
        check_names(cfg)  # every name registered, the options parsed
    assert clip.pipeline.client == ("layer_clip",) and f1.metrics == ("macro_f1", "accuracy")

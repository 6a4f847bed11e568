"""Metrics a config names (``evaluation.metrics``): the example macro-F1 (examples/macro_f1.py,
on the public API) against a confusion matrix worked by hand, the figures a run
records at each evaluation against the final model's predictions counted by
hand, and reruns bit-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.named_parts import (
    CLIPPED,
    F64,
    C,
    config_for,
    examples,  # noqa: F401  (the fixture)
    logits,
    metric_rows,
    tiny_data,
)

import fedforge
from examples_loaded import load_example

pytestmark = pytest.mark.usefixtures("examples")  # loaded as --plugin loads them


def _hand_macro_f1(labels: list[int], preds: list[int]) -> float:
    """Mean over the classes in labels or predictions of 2 TP / (2 TP + FP + FN)."""
    scores = []
    for c in sorted(set(labels) | set(preds)):
        tp = sum(1 for y, p in zip(labels, preds, strict=True) if y == c and p == c)
        fp = sum(1 for y, p in zip(labels, preds, strict=True) if y != c and p == c)
        fn = sum(1 for y, p in zip(labels, preds, strict=True) if y == c and p != c)
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores)


def test_macro_f1_by_hand() -> None:
    metric = load_example("macro_f1").MacroF1()
    labels = torch.tensor([0, 0, 1, 2])
    outputs = F.one_hot(torch.tensor([0, 1, 1, 1]), C).to(F64)  # predictions 0, 1, 1, 1
    # class 0: TP 1, FN 1 -> 2/3; class 1: TP 1, FP 2 -> 1/2; class 2: FN 1 -> 0;
    # class 3: neither labelled nor predicted, left out
    whole = metric.value(metric.batch(outputs, labels))
    assert whole == pytest.approx((2 / 3 + 1 / 2 + 0) / 3, abs=1e-15)
    split = metric.batch(outputs[:1], labels[:1]) + metric.batch(outputs[1:], labels[1:])
    assert metric.value(split) == whole


def test_named_metrics_are_recorded_at_each_evaluation(tmp_path: Path) -> None:
    data = tiny_data()
    cfg = config_for(tmp_path, rounds=2, metrics=["macro_f1", "accuracy"], **CLIPPED)
    result = fedforge.run(cfg, data=data)
    rows = metric_rows(result)
    assert [(r, name) for r, name, _ in rows] == [
        (0, "accuracy"),
        (0, "macro_f1"),
        (1, "accuracy"),
        (1, "macro_f1"),
    ]
    preds = logits(result.params, data.test_x).argmax(dim=1).tolist()
    labels = data.test_y.tolist()
    figures = {name: value for r, name, value in rows if r == 1}
    assert figures["macro_f1"] == pytest.approx(_hand_macro_f1(labels, preds), abs=1e-12)
    hits = sum(p == y for p, y in zip(preds, labels, strict=True))
    assert figures["accuracy"] == pytest.approx(hits / len(labels), abs=1e-15)
    assert figures["accuracy"] == result.rounds[-1].test_accuracy  # the task's own


def test_named_stage_and_metric_reruns_are_bit_identical(tmp_path: Path) -> None:
    data = tiny_data()
    extra = {
        **CLIPPED,
        "rounds": 2,
        "evaluation": {"metrics": ["macro_f1"]},
        "client_fraction": 0.67,
    }
    runs = [fedforge.run(config_for(tmp_path / str(i), **extra), data=data) for i in range(2)]
    assert torch.equal(runs[0].params, runs[1].params)
    stored = [metric_rows(r) for r in runs]
    assert stored[0] == stored[1]

"""Rounds to a target accuracy, read off the best-so-far curve and interpolated between
evaluations as McMahan et al. 2017 do, on hand-worked curves; and the round loop's use
of it (early stop, evaluation schedule) with a scripted evaluator."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from fedforge.config import Config, EvaluationConfig
from fedforge.core.params import ParamSpec
from fedforge.data.federated import FederatedData
from fedforge.evaluation.evaluate import EvalResult, evaluate
from fedforge.evaluation.metrics import best_so_far, rounds_to_target
from fedforge.models import build_model
from fedforge.server import evaluate_round, loop

MakeData = Callable[..., FederatedData]

pytestmark = pytest.mark.usefixtures("one_thread")


def test_best_so_far() -> None:
    assert best_so_far([0.3, 0.5, 0.4, 0.6, 0.6]) == [0.3, 0.5, 0.5, 0.6, 0.6]
    assert best_so_far([]) == []


def test_interpolates_between_the_straddling_evaluations() -> None:
    # 0.8 at round 2, 0.95 at round 3: 0.9 is 0.1/0.15 = 2/3 of the way.
    got = rounds_to_target([1, 2, 3, 4], [0.5, 0.8, 0.95, 0.97], 0.9)
    assert got == pytest.approx(2 + 2 / 3, abs=1e-12)


def test_interpolation_uses_evaluation_rounds() -> None:
    # Evaluated every 5 rounds: 0.7 at 10, 0.9 at 15, target 0.8 -> 12.5.
    assert rounds_to_target([5, 10, 15], [0.5, 0.7, 0.9], 0.8) == pytest.approx(12.5, abs=1e-12)


def test_exact_hit_returns_that_round() -> None:
    assert rounds_to_target([1, 2, 3], [0.5, 0.9, 0.99], 0.9) == pytest.approx(2.0, abs=1e-12)


def test_dip_uses_the_monotone_best_so_far_curve() -> None:
    # Raw: 0.6 0.9 0.7 0.85 0.96; best so far: 0.6 0.9 0.9 0.9 0.96.
    # Target 0.93 is crossed between round 4 (best 0.9) and 5 (0.96): 4 + 0.03/0.06 = 4.5,
    # not 4 + 0.08/0.11 as the raw curve (0.85 -> 0.96) would give.
    got = rounds_to_target([1, 2, 3, 4, 5], [0.6, 0.9, 0.7, 0.85, 0.96], 0.93)
    assert got == pytest.approx(4.5, abs=1e-12)


def test_target_reached_before_a_dip_counts_once() -> None:
    # 0.5 -> 0.92 between rounds 1 and 2: 1 + 0.4/0.42; the later dip and recovery do not move it.
    got = rounds_to_target([1, 2, 3, 4], [0.5, 0.92, 0.7, 0.95], 0.9)
    assert got == pytest.approx(1 + 0.4 / 0.42, abs=1e-12)


def test_never_reached_is_none() -> None:
    assert rounds_to_target([1, 2, 3], [0.5, 0.8, 0.89], 0.9) is None
    assert rounds_to_target([], [], 0.9) is None


def test_reached_at_the_first_evaluation() -> None:
    assert rounds_to_target([1, 2], [0.95, 0.97], 0.9) == 1.0
    assert rounds_to_target([5, 10], [0.99, 0.995], 0.9) == 5.0


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        rounds_to_target([1, 2], [0.5], 0.9)


# ----------------------------------------------------------------------------- in the loop


def _scripted(monkeypatch: pytest.MonkeyPatch, accuracies: list[float]) -> list[int]:
    """Make the round loop's evaluator return ``accuracies`` in turn; returns a list
    that grows by one entry per evaluation."""
    script: Iterator[float] = iter(accuracies)
    calls: list[int] = []

    def fake_evaluate(*args: object, **kwargs: object) -> EvalResult:
        calls.append(len(calls))
        return EvalResult(next(script), 1.0, 16)

    monkeypatch.setattr(evaluate_round, "evaluate", fake_evaluate)
    return calls


def _cfg(**fields: object) -> Config:
    base: dict[str, object] = {
        "model": "2nn",
        "dtype": "float64",
        "num_clients": 2,
        "client_fraction": 1.0,
        "local_epochs": 1,
        "batch_size": None,
    }
    base.update(fields)
    return Config(**base)  # type: ignore[arg-type]


def test_loop_stops_at_target_and_reports_rounds(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _scripted(monkeypatch, [0.5, 0.8, 0.95, 0.97, 0.99])
    cfg = _cfg(rounds=10, target_accuracy=0.9)
    result = loop.run(cfg, data=make_data([3, 4]), progress=False, store=False)
    assert len(result.rounds) == 3 and len(calls) == 3
    assert [r.test_accuracy for r in result.rounds] == [0.5, 0.8, 0.95]
    assert result.summary["rounds_done"] == 3
    assert result.summary["rounds_to_target"] == pytest.approx(2 + 2 / 3, abs=1e-12)
    assert result.summary["best_accuracy"] == 0.95
    assert result.summary["final_accuracy"] == 0.95


def test_loop_evaluates_every_k_rounds_and_the_last(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    # evaluation.every 2 over 5 rounds: evaluations after rounds 2, 4 and 5 (the last).
    calls = _scripted(monkeypatch, [0.5, 0.7, 0.75])
    cfg = _cfg(rounds=5, evaluation=EvaluationConfig(every=2), target_accuracy=0.72)
    result = loop.run(cfg, data=make_data([3, 4]), progress=False, store=False)
    assert len(calls) == 3
    assert [r.test_accuracy for r in result.rounds] == [None, 0.5, None, 0.7, 0.75]
    # The best-so-far 0.7 at 4 rounds, 0.75 at 5: 4 + 0.02/0.05 = 4.4.
    assert result.summary["rounds_to_target"] == pytest.approx(4.4, abs=1e-12)
    assert result.summary["final_accuracy"] == 0.75


def test_loop_without_target_runs_all_rounds(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scripted(monkeypatch, [1.0, 1.0])
    result = loop.run(_cfg(rounds=2, target_accuracy=None), data=make_data([3, 4]), store=False)
    assert len(result.rounds) == 2
    assert result.summary["rounds_to_target"] is None


def test_evaluate_counts_by_hand() -> None:
    # A 2NN whose last layer is zero except bias: every example is predicted as class 3.
    model = build_model("2nn", seed=0, dtype=torch.float64)
    spec = ParamSpec.of(model)
    params = spec.flatten(model, torch.float64)
    views = spec.views(params)
    views["fc3.weight"].zero_()
    views["fc3.bias"].zero_()
    views["fc3.bias"][3] = 1.0
    x = torch.randn(10, 1, 28, 28, dtype=torch.float64)
    y = torch.tensor([3, 3, 3, 0, 1, 2, 4, 5, 6, 3])
    got = evaluate(model, spec, params, x, y, batch_size=3)  # batches of 3, 3, 3, 1
    assert got.accuracy == 0.4 and got.num_examples == 10
    # Logits (0,0,0,1,0,...): log-softmax is 1 - log(9 + e) for class 3, -log(9 + e) else.
    e = torch.tensor(1.0, dtype=torch.float64).exp()
    expected = (4 * (torch.log(9 + e) - 1) + 6 * torch.log(9 + e)) / 10
    assert got.loss == pytest.approx(float(expected), abs=1e-12)

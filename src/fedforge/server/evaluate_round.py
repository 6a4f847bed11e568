"""A round's evaluation of the global model: the test set's score and loss
when an evaluation is due, the validation split's (the target's reading when
the run carves one), the named metrics and the per-client rows, each kept in
the run's loop state."""

from __future__ import annotations

import torch

from fedforge.evaluation.evaluate import EvalResult, evaluate
from fedforge.evaluation.validation import validation_figures
from fedforge.server import diagnostics
from fedforge.server.experiment import Experiment
from fedforge.server.hooks import RoundHooks, RoundInfo
from fedforge.server.state import LoopState
from fedforge.server.stops import ends_run


def test_scores(exp: Experiment, params: torch.Tensor, round_idx: int = 0) -> EvalResult:
    """The task's score and loss of ``params`` on the test set, and the run's named
    metrics' figures; with a drift, the test rows as round ``round_idx``'s phase
    reads them (the distribution the round's clients trained on)."""
    data, cfg = exp.data, exp.cfg
    x, y, batch = data.test_x, data.test_y, cfg.evaluation.batch_size
    if exp.drift is not None:
        x, y = exp.drift.test_rows(x, y, round_idx)
    return evaluate(exp.model, exp.spec, params, x, y, batch, exp.metrics, exp.extra_metrics)


def evaluate_phase(
    exp: Experiment,
    state: LoopState,
    round_idx: int,
    start: int,
    info: RoundInfo | None = None,
    hooks: RoundHooks | None = None,
    moved: int = 0,
) -> tuple[float | None, float | None]:
    """The global model's test accuracy and loss when an evaluation is due (a
    period's model is new at its end: due if any round of it was; the run's last
    always, ``moved``: the round's bytes); the round's hooks are told."""
    cfg = exp.cfg
    every = cfg.evaluation.every
    if not ((round_idx + 1) // every > start // every or ends_run(exp, state, round_idx, moved)):
        return None, None
    ev = test_scores(exp, state.params, round_idx)
    if info is not None and hooks is not None:
        hooks.evaluated(info, ev.accuracy, ev.loss)
    state.eval_rounds.append(round_idx + 1)
    held, b, scores = exp.data.validation_data(), cfg.evaluation.batch_size, exp.metrics
    val = None if held is None else evaluate(exp.model, exp.spec, state.params, *held, b, scores)
    state.eval_accuracy.append(ev.accuracy if val is None else val.accuracy)  # the target's
    extra = dict(ev.extra) if val is None else {**ev.extra, **validation_figures(val)}
    if extra:  # the named metrics and validation scores: the run store's eval_metrics table
        state.outputs["eval_metrics"] = [(round_idx, n, v) for n, v in extra.items()]
    if cfg.evaluation.clients:  # each client's held-out slice, per-class test accuracy
        state.outputs.update(diagnostics.evaluation_rows(exp, state.params, round_idx))
    return ev.accuracy, ev.loss

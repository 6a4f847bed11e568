"""The rounds of one run, from a :class:`LoopState` to a :class:`RunResult`:
each round run (``round.py``) and recorded (store, privacy spent, progress bar;
then the hooks are told, the alert rules among them), until the last round, the
target accuracy, the privacy budget or a stall (``stops.py``) ends the run; a
checkpoint every ``checkpoint_every`` rounds, and one before stopping when
SIGINT or SIGTERM came. ``loop.py`` makes or resumes the run's store around it
and settles the store after it."""

from __future__ import annotations

import time

from fedforge.report.progress import Progress, percent
from fedforge.server.buffered import run_buffered_round
from fedforge.server.builtin_hooks import run_hooks
from fedforge.server.clustered import run_clustered_round
from fedforge.server.evaluate_round import test_scores
from fedforge.server.experiment import Experiment
from fedforge.server.hooks import RoundHooks
from fedforge.server.proxy import shipped_bytes
from fedforge.server.result import RunResult
from fedforge.server.round import run_round
from fedforge.server.state import LoopState, StopSignals, aggregator_state
from fedforge.server.stops import bytes_spent, over_budget, stalled
from fedforge.server.summary import summarize_run
from fedforge.store import CheckpointError, RoundRecord, RunStore, save_checkpoint


def run_rounds(
    exp: Experiment,
    state: LoopState,
    run_store: RunStore | None,
    show: bool,
    stop: StopSignals,
    hooks: RoundHooks | None = None,
) -> RunResult:
    """Run the rounds from ``state.next_round`` (recorded in ``run_store`` when there
    is one) until one of the run's stops, under ``stop``'s signal guard, telling
    ``hooks`` (None: the built-in ones) of each round."""
    cfg = exp.cfg
    hooks = hooks if hooks is not None else run_hooks()
    bar = Progress(
        cfg.rounds,
        cfg.name,
        enabled=show,
        initial=state.next_round,
        score_name=exp.metrics.score_name,
    )
    start = time.perf_counter()
    if cfg.evaluation.initial and state.next_round == 0 and state.initial_eval is None:
        state.initial_eval = _evaluate_initial(exp, state, bar)
    stopped: str | None = None
    stops: dict[str, str] = {}  # summary key: why the run stopped early
    while state.next_round < cfg.rounds:
        budget_stop = over_budget(exp, state.next_round, state.privacy)
        if budget_stop is not None:  # the next round would spend more than target_epsilon
            bar.write(f"fedforge: {budget_stop}")
            stops["privacy_stop"] = budget_stop
            break
        byte_stop = bytes_spent(cfg, state.total_bytes, state.next_round - 1)
        if byte_stop is not None:  # the rounds so far moved the budget's bytes
            byte_stop += f"; stopped at {_reached(exp, state)}"
            bar.write(f"fedforge: {byte_stop}")
            stops["byte_stop"] = byte_stop
            break
        record = _one_round(exp, state, run_store, bar, hooks)
        target = cfg.target_accuracy
        evaluated = record.test_accuracy is not None
        if target is not None and evaluated and max(state.eval_accuracy) >= target:
            break
        stall_stop = stalled(cfg, state)  # also in the last round: the summary says so
        if stall_stop is not None:
            bar.write(f"fedforge: {stall_stop}")
            stops["stall_stop"] = stall_stop
            break
        if state.next_round == cfg.rounds:
            break
        if _checkpoint_due(exp, state, run_store, stop, start, bar, hooks):
            stopped = stop.name
            break
    bar.close()
    seconds = state.seconds_before + time.perf_counter() - start
    result = _result(exp, state, seconds, stops, stopped, stop)
    hooks.run_end(result)
    return result


def _reached(exp: Experiment, state: LoopState) -> str:
    """The test score of the last evaluated model, in words (the round a stop ends
    the run with is evaluated: ``stops.ends_run``)."""
    name = exp.metrics.score_name
    last = next((r for r in reversed(state.records) if r.test_accuracy is not None), None)
    if last is None or last.test_accuracy is None:
        return f"test {name} not evaluated"
    score = last.test_accuracy
    shown = f"{score:.4f}" if name == "R^2" else percent(score)
    return f"test {name} {shown} (round {last.round_idx + 1})"


def _evaluate_initial(exp: Experiment, state: LoopState, bar: Progress) -> tuple[float, float]:
    """The initial model's test accuracy and loss (``evaluation.initial``: a baseline)."""
    ev = test_scores(exp, state.params)
    name, score = exp.metrics.score_name, ev.accuracy
    shown = f"{score:.4f}" if name == "R^2" else percent(score)
    bar.write(f"fedforge: initial model: {name} {shown}, loss {ev.loss:.4f}")
    return ev.accuracy, ev.loss


def _one_round(
    exp: Experiment, state: LoopState, run_store: RunStore | None, bar: Progress, hooks: RoundHooks
) -> RoundRecord:
    """Run round ``state.next_round`` and record it (store, privacy spend, bar); then
    the hooks are told it is in the store (the alert rules)."""
    clip = state.privacy.get("clip_norm", exp.cfg.privacy.clip_norm)  # this round's
    one = run_buffered_round if state.buffered is not None else run_round
    if exp.algorithm.clusters is not None:  # a model per cluster of clients
        one = run_clustered_round
    record, clients = one(exp, state, state.next_round, bar, hooks, run_store)
    every, rounds = exp.cfg.communication.upload_every, exp.cfg.rounds
    record = shipped_bytes(exp.proxy, state.selection, record, every, rounds)  # proxy rows
    state.records.append(record)
    state.total_bytes += record.bytes_up + record.bytes_down
    state.next_round += 1
    if run_store is not None:
        run_store.record_round(record, clients, state.anomalies(record.round_idx))
        for table, rows in state.outputs.items():  # per-client eval, diagnostics
            run_store.record_rows(table, record.round_idx, rows)
    state.outputs = {}
    priv = exp.privacy
    epsilon = priv.epsilon(state.next_round, state.privacy) if priv is not None else None
    if run_store is not None and epsilon is not None and exp.privacy is not None:
        run_store.record_privacy(record.round_idx, epsilon, exp.privacy.delta, clip)
    bar.update(record.test_accuracy, record.test_loss, state.total_bytes, epsilon)
    hooks.recorded()  # a run with a store: the round is in it
    return record


def _checkpoint_due(
    exp: Experiment,
    state: LoopState,
    run_store: RunStore | None,
    stop: StopSignals,
    start: float,
    bar: Progress,
    hooks: RoundHooks,
) -> bool:
    """Write the checkpoint when one is due (every ``checkpoint_every`` rounds, or
    a signal came); True when a signal asks the loop to stop now."""
    every = exp.cfg.checkpoint_every
    due = stop.signum is not None or (every > 0 and state.next_round % every == 0)
    failed = None
    if due and run_store is not None:
        ckpt = state.checkpoint(time.perf_counter() - start)
        ckpt.aggregator_state = aggregator_state(exp.pipeline.aggregator)
        ckpt.loop["hooks"] = hooks.state_dict()  # plain JSON data, by hook name
        try:
            save_checkpoint(run_store.path, ckpt, state.client_state)
        except CheckpointError as exc:  # e.g. a full disk: the older ones are whole
            failed = f"{exc}; a resume starts from the checkpoint before"
            bar.write(f"fedforge: {failed}" + ("" if stop.signum else "; the run goes on"))
    if stop.signum is None:
        return False
    done = "no checkpoint written" if failed else "checkpoint written"
    bar.write(f"fedforge: {done} before round {state.next_round + 1}; stopping")
    return True


def _result(
    exp: Experiment,
    state: LoopState,
    seconds: float,
    stops: dict[str, str],
    stopped: str | None,
    stop: StopSignals,
) -> RunResult:
    """The loop's result: parameters, rounds, summary, what was refused or skipped."""
    evals = (state.eval_rounds, state.eval_accuracy)
    summary = summarize_run(
        exp,
        state.records,
        evals,
        seconds,
        state.privacy,
        history=state.selection,
        virtual_s=state.virtual_s,
    )
    if state.initial_eval is not None:
        summary["initial_accuracy"], summary["initial_loss"] = state.initial_eval
    summary.update(stops)
    if state.buffered is not None:  # buffered aggregation: the virtual clock's time
        summary["virtual_time_s"] = state.buffered.now
    return RunResult(
        state.params,
        state.records,
        summary,
        rejected=state.rejected,
        skipped=state.skipped,
        stopped=stopped,
        signalled=stop.name if stopped is None and stop.signum is not None else None,
    )

"""The round loop (McMahan et al. 2017, Algorithm 1, server side).

Each round: sample the cohort, encode the payload, let the engine run the
clients, decode and check every update, aggregate, step the server optimizer,
evaluate every ``evaluation.every`` rounds, record the round (the alert rules of
fedforge.alerts watch it, from the store). Stops at the target
accuracy or after ``rounds``. Runs on the server; trusts nothing it decodes.

:func:`run` starts a run, :func:`resume` continues one from its last good
checkpoint; both drive the same loop (``run_rounds.py``) over a :class:`LoopState`,
then settle the run store: final parameters and summary, or why the run stopped.
A checkpoint is written every ``checkpoint_every`` rounds, and after the current
round when SIGINT or SIGTERM arrives (the run is then marked stopped and can be
resumed).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedforge.config import Config, override
from fedforge.config.names import config_components
from fedforge.core.errors import ConfigError, StopNow, StoreError
from fedforge.core.plugin_versions import used_plugins
from fedforge.data import PartitionSummary
from fedforge.data.federated import FederatedData
from fedforge.engines import Engine, close_engine
from fedforge.engines.threads import set_threads
from fedforge.server.buffered import check_buffered
from fedforge.server.builtin_hooks import run_hooks
from fedforge.server.experiment import Experiment, build, client_tables
from fedforge.server.hooks import RoundHook, RoundHooks
from fedforge.server.partition_file import partition_summary, write_partition
from fedforge.server.result import RunResult
from fedforge.server.run_rounds import run_rounds
from fedforge.server.state import LoopState, RunLock, StopSignals, load_aggregator_state
from fedforge.server.summary import format_summary
from fedforge.server.workload import say_start
from fedforge.store import CheckpointError, RunStore, list_checkpoints, load_latest
from fedforge.store.build_record import check_build, write_build
from fedforge.store.disk import os_error_text
from fedforge.store.edited import edited_config_note
from fedforge.store.final import save_final
from fedforge.systems.summary import (
    POPULATION_FILE,
    format_population,
    population_summary,
    write_population,
)
from fedforge.tasks import Task

__all__ = ["RunResult", "format_summary", "resume", "run"]


def run(
    cfg: Config,
    data: FederatedData | None = None,
    progress: bool = False,
    store: bool = True,
    task: Task | None = None,
    engine: Engine | None = None,
    hooks: Sequence[RoundHook] | RoundHooks = (),
) -> RunResult:
    """Run ``cfg`` to its target or its last round; record it in a run store.
    ``data``: the caller's data set (else the config's); ``task``: the caller's model,
    loss and metrics (else the config's task); ``engine``: where the clients run
    (else the config's: a deployment server passes its network engine);
    ``hooks``: the caller's round hooks (server/hooks.py), told of each round after
    the built-in ones (or a whole list from ``builtin_hooks.run_hooks``: a
    deployment server's, with its rollout)."""
    exp = _with_engine(build(cfg, data, task), engine)
    check_buffered(exp)
    chain = _chain(hooks)  # hooks a config names (the registry's) are to join these
    partition = partition_summary(exp)
    if progress:
        print(f"partition: {partition.format()}", flush=True)
    population = _population(exp)
    if progress and population is not None:
        print(format_population(population), flush=True)
    say_start(exp, 0, progress)
    if not store:
        return _drive(exp, None, None, LoopState.fresh(exp), partition, progress, chain)
    run_store = RunStore.create(cfg.runs_dir, cfg)
    try:
        write_partition(run_store.path / "partition.json", partition)
        if population is not None:
            write_population(run_store.path / POPULATION_FILE, population)
        write_build(
            run_store.path,
            exp.spec,
            exp.data_fingerprint,
            exp.metrics.score_name,
            exp.engine.name,
            used_plugins(config_components(cfg)),
        )
        lock = RunLock(run_store.path).acquire()
    except BaseException as exc:  # a run that never started is removed, not left half-made
        run_store.close()
        shutil.rmtree(run_store.path, ignore_errors=True)
        if isinstance(exc, OSError):
            raise StoreError(f"cannot start run '{run_store.path}': {os_error_text(exc)}") from None
        raise
    return _drive(exp, run_store, lock, LoopState.fresh(exp), partition, progress, chain)


def resume(
    run_dir: Path | str,
    data: FederatedData | None = None,
    progress: bool = False,
    task: Task | None = None,
    device: str | None = None,
    engine: Engine | None = None,
    hooks: Sequence[RoundHook] | RoundHooks = (),
) -> RunResult:
    """Continue the run in ``run_dir`` from its last good checkpoint, with the config
    stored in the run; rounds recorded after that checkpoint are run again. A run
    stopped before its first checkpoint starts again from round 0 (its state
    there is the seed's). ``device``: where local training and evaluation go on
    (None: the stored config's); the checkpoints are on the host, so any will do.
    ``hooks``: the run's round hooks again, as for :func:`run` (their states come
    from the checkpoint)."""
    run_store = RunStore.open(run_dir)
    lock = RunLock(run_store.path)
    try:
        finished = f"run '{run_store.path}' is finished; there is nothing to resume"
        if run_store.status == "finished":
            raise CheckpointError(finished)
        stored = run_store.config()
        edited = edited_config_note(run_store.path, stored)
        if edited is not None:  # a hand-edited config.yaml: say it is not what runs
            print(f"fedforge: {edited}", file=sys.stderr, flush=True)
        if device is not None:
            stored = override(stored, {"device": device})
        exp = _with_engine(build(stored, data, task), engine)
        check_buffered(exp)
        chain = _chain(hooks)
        lock.acquire()  # refuses while another process writes the run, or a read-only one
        plugins = used_plugins(config_components(exp.cfg))
        check_build(run_store.path, exp.spec, exp.data_fingerprint, exp.cfg, plugins)  # not damage
        if run_store.status == "finished":  # it was running, and ended while we built
            raise CheckpointError(finished)
        state = _resumed_state(exp, run_store, chain)
        run_store.rewind(state.next_round)
    except BaseException:
        lock.release()
        run_store.close()
        raise
    partition = partition_summary(exp)
    if progress:
        first = " (no checkpoint yet: from the start)" if state.next_round == 0 else ""
        print(f"resuming {run_store.path.name} at round {state.next_round + 1}{first}", flush=True)
        population = _population(exp)
        if population is not None:
            print(format_population(population), flush=True)
    say_start(exp, state.next_round, progress)
    return _drive(exp, run_store, lock, state, partition, progress, chain)


def _chain(hooks: Sequence[RoundHook] | RoundHooks) -> RoundHooks:
    """The run's hooks: a caller's after the built-in ones, or a whole list as it is."""
    return hooks if isinstance(hooks, RoundHooks) else run_hooks(hooks)


def _with_engine(exp: Experiment, engine: Engine | None) -> Experiment:
    """``exp`` with ``engine`` in place of the one it was built with (closed). A
    clustered algorithm is refused on a deployment's engine (``remote``): it serves
    one model a round."""
    if engine is None:
        return exp
    close_engine(exp.engine)
    if exp.algorithm.clusters is not None and engine.name == "remote":
        raise ConfigError(
            f"algorithm {exp.algorithm.name!r} runs in the simulator: a deployment "
            "serves one model a round"
        )
    return dataclasses.replace(exp, engine=engine)


def _population(exp: Experiment) -> dict[str, Any] | None:
    """The quantiles of the run's system profiles (None: it has none)."""
    s = exp.systems
    return None if s is None else population_summary(s.profiles, s.availability)


def _add_population(exp: Experiment, result: RunResult) -> None:
    population = _population(exp)
    if population is not None:
        result.summary["population"] = population


def _resumed_state(exp: Experiment, run_store: RunStore, hooks: RoundHooks) -> LoopState:
    """The newest good checkpoint's state; round 0's (the seed's) when there is no
    checkpoint or every one is damaged."""
    if not list_checkpoints(run_store.path):
        return LoopState.fresh(exp)
    tables = client_tables(exp)  # EF residuals, SCAFFOLD controls
    try:
        ckpt = load_latest(run_store.path, tables)
    except CheckpointError as exc:  # every checkpoint damaged: from the start
        for table in tables.values():
            table.clear()  # rows a half-loaded checkpoint left
        print(f"fedforge: {exc}; starting again from round 1", file=sys.stderr)
        return LoopState.fresh(exp)
    state = LoopState.from_checkpoint(exp, ckpt, run_store.rounds(), tables)
    load_aggregator_state(exp.pipeline.aggregator, ckpt)
    hooks.load_state_dict(ckpt.loop.get("hooks", {}))
    return state


def _drive(
    exp: Experiment,
    run_store: RunStore | None,
    lock: RunLock | None,
    state: LoopState,
    partition: PartitionSummary,
    progress: bool,
    hooks: RoundHooks,
) -> RunResult:
    """Run the loop on the run's torch threads (those of the caller's process are
    restored after it), then settle the run store."""
    before = set_threads(exp.threads.server) if exp.threads is not None else None
    try:
        return _drive_rounds(exp, run_store, lock, state, partition, progress, hooks)
    finally:
        if before is not None:
            set_threads(before)


def _drive_rounds(
    exp: Experiment,
    run_store: RunStore | None,
    lock: RunLock | None,
    state: LoopState,
    partition: PartitionSummary,
    progress: bool,
    hooks: RoundHooks,
) -> RunResult:
    """Run the loop (under the signal guard when there is a store, whose lock the
    caller holds), then settle the run store: final params and summary, or why not."""
    if run_store is None or lock is None:
        try:
            result = run_rounds(exp, state, None, progress, StopSignals(enabled=False), hooks)
        finally:
            close_engine(exp.engine)
        result.summary["heterogeneity"] = partition.heterogeneity
        _add_population(exp, result)
        return result
    exp.engine.bind_store(run_store)  # a deployment's commits after a resume
    try:
        with StopSignals() as stop:
            result = run_rounds(exp, state, run_store, progress, stop, hooks)
        result.summary["heterogeneity"] = partition.heterogeneity
        _add_population(exp, result)
        _settle(exp, run_store, result, state.next_round)
    except BaseException as exc:
        said: dict[str, Any] = {}
        if isinstance(exc, StopNow):
            # stopped on purpose, mid-round: resumable from the last checkpoint, so
            # recorded as a signal's stop (`runs` shows it stopped), not a failure
            exc.run_dir = run_store.path
            said = {"error": str(exc), "stopped": exc.signal_name}
        else:
            kind = "interrupted" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
            text = str(exc).splitlines()[0][:300] if str(exc) else ""
            why = f"run stopped: {kind}" + (f": {text}" if text else "")
            said = {"error": why + f"; resume with: fedforge resume {run_store.path}"}
        try:
            run_store.finish(said, status="failed")
        except Exception as also:  # e.g. the full disk that failed the run: say both
            exc.add_note(f"(and the run store could not record it: {also})")
        raise
    finally:
        close_engine(exp.engine)
        lock.release()
        run_store.close()
    return result


def _settle(exp: Experiment, run_store: RunStore, result: RunResult, next_round: int) -> None:
    result.run_dir = run_store.path
    result.summary["run_dir"] = str(run_store.path)
    if result.stopped:
        result.summary["stopped"] = result.stopped  # a signal: `runs` shows it stopped
        result.summary["error"] = (
            f"stopped by {result.stopped} before round {next_round + 1}; "
            f"resume with: fedforge resume {run_store.path}"
        )
        run_store.finish(result.summary, status="failed")
    else:
        personal, clusters = exp.algorithm.personal, exp.algorithm.clusters
        # FedBN: each client's model is its own batch norm; a clustered algorithm:
        # each cluster's model and each client's cluster (the table). A StoreError
        # (a full disk) leaves no half-written file, and the run failed, resumable
        own = None if personal is None else personal.final()
        if clusters is not None and clusters.table is not None:
            own = clusters.table.state()
        save_final(run_store.path, result.params, list(exp.spec.names), own)
        run_store.finish(result.summary)

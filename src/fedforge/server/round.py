"""One round on the server (McMahan et al. 2017, Algorithm 1), as phases:

    sample -> configure -> collect -> aggregate -> server step -> evaluate -> record

``configure`` gives each cohort client its task and the payload; ``collect``
feeds the round's collector (``server/collectors/``) one message at a time;
``aggregate`` applies the aggregate stages (central DP noise) and the
algorithm's server state; the server optimizer steps; the model is evaluated
when due. A refused update or a skipped round is logged with its reason and
never reaches the global model; nor does a step that would make the model
non-finite (the round is skipped, the last good model kept).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from functools import partial

import torch

from fedforge.algorithms.plan import LocalPlan
from fedforge.client.runtime import ClientTask, encode_payload
from fedforge.core.params import all_finite
from fedforge.pipeline.pipeline import StageContext
from fedforge.report.progress import Progress
from fedforge.selection.periods import period_plan, upload_period
from fedforge.server.builtin_hooks import run_hooks
from fedforge.server.client_lr import (
    bound_rooms,
    own_scales,
    scaled_tasks,
    with_upload_clip,
)
from fedforge.server.cohort import live_pool, sample
from fedforge.server.collect import collect
from fedforge.server.collectors import (
    Collected,
    Collector,
    DenseCost,
    GatheredCohort,
    HierarchicalMean,
    RoundLog,
    StreamingMean,
)
from fedforge.server.collectors.base import FLOAT32_BYTES
from fedforge.server.collectors.intake import Limits
from fedforge.server.collectors.streaming import UploadPhase
from fedforge.server.diagnostics import RoundDiagnostics
from fedforge.server.evaluate_round import evaluate_phase
from fedforge.server.experiment import Experiment
from fedforge.server.hooks import RoundEnd, RoundHooks, RoundInfo
from fedforge.server.state import LoopState
from fedforge.server.stops import round_bytes
from fedforge.server.stragglers import cohort_tasks
from fedforge.server.virtual_clock import advance, round_clock
from fedforge.store import ClientRecord, RoundRecord, RunStore


@dataclass(frozen=True)
class Orders:
    """What ``configure`` decided for a round: who trains, on what plan, from what."""

    round_idx: int
    start: int  # the upload period's first round (its cohort and plan)
    cohort: list[int]  # the sampled clients: each gets the payload
    tasks: list[ClientTask]  # the clients that train (stragglers may be dropped)
    plan: LocalPlan
    payload: bytes
    dense: DenseCost
    limits: Limits  # the weight a count may claim, the largest update norm


def run_round(
    exp: Experiment,
    state: LoopState,
    round_idx: int,
    bar: Progress,
    hooks: RoundHooks | None = None,
    store: RunStore | None = None,
) -> tuple[RoundRecord, list[ClientRecord]]:
    """One round: the phases of the module docstring, top to bottom, with the run's
    ``hooks`` (None: the built-in ones) told of its start, uploads, evaluation and
    end (server/hooks.py); its clients asked as the hooks' gates allow. ``store``:
    the run's store, which the hooks may read (the caller records the round)."""
    t0 = time.perf_counter()
    hooks = hooks if hooks is not None else run_hooks()
    cfg = exp.cfg
    start, end = upload_period(round_idx, cfg.communication.upload_every, cfg.rounds)
    if round_idx != end:  # the period's cohort trains locally: nothing travels
        return _local_round(exp, state, round_idx, start, bar, hooks, t0, store), []
    pool, short = live_pool(exp, round_idx)
    clock = round_clock(exp, state, round_idx)  # None: no systems profiles
    if clock is not None:  # only the clients online at the round's virtual start
        pool = clock.pool(pool)
        short = short if pool else f"no client online at virtual time {clock.start_s:.6g} s"
    cohort = sample(exp, start, pool, state.selection)
    if short is not None:  # a deployment with too few clients there
        info = RoundInfo(
            exp, state, bar, round_idx, start, "short", list(cohort), [], state.params, store=store
        )
        if clock is not None:  # the round waits until a client comes online
            clock.duration_s = clock.idle_until()
            advance(state, clock)
        return _short_round(exp, state, info, hooks, short, t0), []
    exp.engine.begin_round(round_idx)  # a deployment tells the last round's commits
    orders = configure(exp, state, round_idx, start, cohort)
    if clock is not None:  # the clients that fail do not train
        tasks = clock.without_failed(cohort, orders.tasks, len(orders.payload))
        orders = dataclasses.replace(orders, tasks=tasks)
    trainers = [t.client_id for t in orders.tasks]
    own = list(cohort)  # the hooks' own list: the round's is not theirs to change
    info = RoundInfo(
        exp, state, bar, round_idx, start, "upload", own, trainers, state.params, store=store
    )
    hooks.round_start(info)  # a deployment's rollout: cold start, canary, serving
    askable = hooks.askable(info, cohort)  # the others are dropouts (not cold-started)
    log = RoundLog(state.rejected, state.skipped, bar, round_idx, partial(_refused, hooks, info))
    collector = collector_for(exp, orders, log, info.diagnostics)
    arrivals = clock.arrivals if clock is not None else None
    collected = collect(exp, collector, orders.tasks, orders.payload, round_idx, arrivals, askable)
    collected = _as_sent(exp, collected, orders)
    aggregate, clients, moved = aggregate_phase(exp, state, collected, log)
    clients = server_step(exp, state, aggregate, clients, moved, log)
    applied = not log.skipped_now
    hooks.taken(info, list(clients))
    state.remember_norms(collected, cfg)  # the next rounds' bounds
    # a deployment's clients keep their state; its measured client times
    state.outputs.update(exp.engine.end_round(round_idx, sorted(clients)))
    traffic = round_bytes(exp, state, collected, cohort)
    test_acc, test_loss = evaluate_phase(exp, state, round_idx, start, info, hooks, traffic)
    record = round_record(exp, orders, collected, clients, test_acc, test_loss, t0)
    durations: dict[int, float] = {}
    if clock is not None:
        advance(state, clock)
        durations = clock.durations()
    seen = _uploads_seen(collected, exp.privacy is not None and exp.privacy.secagg is not None)
    used = sorted(clients)
    rows = list(clients.values())
    arrived = sorted(collected.arrived)
    hooks.round_end(info, RoundEnd(record, used, applied, arrived, seen, rows, durations))
    return record, rows


def _refused(hooks: RoundHooks, info: RoundInfo, client_id: int, why: str) -> None:
    """Tell the round's hooks of a refused upload."""
    hooks.upload(info, client_id, False, why)


def _uploads_seen(collected: Collected, secure: bool) -> list[int]:
    """The clients whose updates the server saw this round: every upload that
    arrived, taken or refused, the round applied or skipped; under secure
    aggregation the clients in the revealed sum when it was applied (a sum
    revealed and then not applied, e.g. short of ``robust.min_clients``, counts
    every masked input that arrived: conservative)."""
    if secure and collected.aggregate is not None:
        return sorted(collected.clients)
    return sorted(collected.arrived)


def _as_sent(exp: Experiment, collected: Collected, orders: Orders) -> Collected:
    """A deployment's bytes down as they crossed the wire: the models its clients
    downloaded to the end and the protocol messages handed out since the last
    round's record, in place of a payload counted for every cohort client."""
    sent = exp.engine.sent_down()
    if sent is None:
        return collected
    nbytes, downloads = sent
    return dataclasses.replace(
        collected, bytes_down=nbytes, float32_down=orders.dense.down * downloads
    )


def _short_round(
    exp: Experiment, state: LoopState, info: RoundInfo, hooks: RoundHooks, why: str, t0: float
) -> RoundRecord:
    """A round skipped before anything was sent: the model unchanged, nothing seen
    (no privacy spent), evaluated when due."""
    hooks.round_start(info)
    r, start = info.round_idx, info.start
    RoundLog(state.rejected, state.skipped, info.bar, r).skip(why)
    test_acc, test_loss = evaluate_phase(exp, state, r, start, info, hooks)
    record = _record_of_nothing(exp, r, start, 0, t0)
    record = dataclasses.replace(record, test_accuracy=test_acc, test_loss=test_loss)
    hooks.round_end(info, RoundEnd(record, [], False))
    return record


def configure(
    exp: Experiment, state: LoopState, round_idx: int, start: int, cohort: list[int]
) -> Orders:
    """Each cohort client's task and the round's payload."""
    cfg = exp.cfg
    plan = with_upload_clip(period_plan(exp.algorithm, start, round_idx), cfg, state.clip_norms)
    server = exp.algorithm.server  # an algorithm's server state (SCAFFOLD's c) travels too
    more = server.payload(state.algorithm_state) if server is not None else None
    downlink = exp.communication.downlink if exp.communication is not None else None
    payload = encode_payload(state.params, round_idx, downlink, cfg.seed, more)
    more_down = sum(t.numel() for t in (more or {}).values())
    dense = DenseCost.of(exp.spec.size, more_down)
    tasks = cohort_tasks(cfg, exp.algorithm, cohort, round_idx, plan)  # stragglers
    rooms: dict[int, float] = {}
    if exp.lr_rule is not None:  # each client's own lr, and its bounds' room (client_lr.py)
        scales = own_scales(tasks, exp.lr_rule, cfg, round_idx, exp.client_sizes(), state.selection)
        rooms = bound_rooms(scales, cfg)
        tasks = scaled_tasks(tasks, scales, rooms)
    limits = Limits.of(exp, state.params, state.update_norms, rooms)
    return Orders(round_idx, start, cohort, tasks, plan, payload, dense, limits)


def collector_for(
    exp: Experiment, orders: Orders, log: RoundLog, diag: RoundDiagnostics | None
) -> Collector:
    """The collector the run's pipeline needs."""
    round_idx, payload_bytes, dense = orders.round_idx, len(orders.payload), orders.dense
    if exp.privacy is not None and exp.privacy.secagg is not None:
        from fedforge.server.collectors.secure import SecureSum  # imports ``cryptography``

        ids = [t.client_id for t in orders.tasks]
        return SecureSum(exp, round_idx, ids, log, payload_bytes, dense)
    kind: type[UploadPhase] = StreamingMean
    if not exp.pipeline.streams:
        kind = GatheredCohort
    elif exp.communication is not None and exp.communication.group_of is not None:
        kind = HierarchicalMean
    return kind(exp, round_idx, orders.cohort, log, payload_bytes, dense, orders.limits, diag)


def aggregate_phase(
    exp: Experiment, state: LoopState, collected: Collected, log: RoundLog
) -> tuple[torch.Tensor | None, dict[int, ClientRecord], dict[str, torch.Tensor] | None]:
    """The aggregate after its stages (central DP noise), the clients it holds, and
    the algorithm's server state it moves to (SCAFFOLD's c); None when it cannot
    be applied (the round is skipped with the reason)."""
    aggregate, clients = collected.aggregate, collected.clients
    if aggregate is None:  # the round is skipped: no client's update is in the model
        return None, {}, None
    ctx = StageContext(log.round_idx, exp.cfg.seed, state=state.privacy)
    aggregate = exp.pipeline.run_aggregate(aggregate, ctx)
    if not all_finite(aggregate):  # finite updates, too large to sum
        log.skip(f"the aggregate overflowed {state.params.dtype} (inf or NaN)")
        return None, {}, None
    server, step = exp.algorithm.server, exp.algorithm.server_step
    moved: dict[str, torch.Tensor] = {}
    if server is not None:
        moved = server.moved(state.algorithm_state, collected.received, exp.cfg.num_clients)
    if step is not None:  # FedNova's tau_eff, FedDyn's h, q-FedAvg's K / sum h_k
        aggregate, moved = step(aggregate, moved, collected.received)
        if not all_finite(aggregate):
            log.skip("the algorithm's server step overflowed the aggregate (inf or NaN)")
            return None, {}, None
    if server is None:
        return aggregate, clients, None
    bad = [name for name, t in moved.items() if not all_finite(t)]
    if bad:  # finite control deltas, too large to sum: c would be inf for good
        log.skip(f"the server's {', '.join(bad)} overflowed (inf or NaN)")
        return None, {}, None
    return aggregate, clients, moved


def server_step(
    exp: Experiment,
    state: LoopState,
    aggregate: torch.Tensor | None,
    clients: dict[int, ClientRecord],
    moved: dict[str, torch.Tensor] | None,
    log: RoundLog,
) -> dict[int, ClientRecord]:
    """The server optimizer's step on the aggregate; entries that never move
    (FedBN's global batch norm, frozen parameters) are put back. A step to a
    model holding inf or NaN is not taken: the round is skipped, the model and
    the optimizer's state are as before. Returns the clients whose updates the
    model took (none when skipped)."""
    if aggregate is not None:
        params = state.params
        before = state.optimizer.state_dict()  # copies: put back if the step is refused
        stepped = state.optimizer.step(params, aggregate)
        personal = exp.algorithm.personal
        if personal is not None:  # FedBN: the global batch-norm entries never move
            stepped = stepped.masked_scatter(personal.mask, params[personal.mask])
        frozen = exp.spec.frozen_mask()
        if frozen is not None:  # DP noise or server momentum would move them: they stay
            stepped = stepped.masked_scatter(frozen, params[frozen])
        if all_finite(stepped):
            state.params = stepped
            if moved is not None:  # e.g. c += sum of the used clients' delta c_k / N
                state.algorithm_state = moved
        else:
            state.optimizer.load_state_dict(before)
            log.skip(
                f"the server step would make the model non-finite (inf or NaN in "
                f"{state.params.dtype}); the last good model is kept"
            )
            aggregate, clients = None, {}
    elif not log.skipped_now:
        log.skip("no valid update")
    return clients if aggregate is not None else {}


def round_record(
    exp: Experiment,
    orders: Orders,
    collected: Collected,
    clients: dict[int, ClientRecord],
    test_acc: float | None,
    test_loss: float | None,
    t0: float,
) -> RoundRecord:
    """The round's row: the training loss weighted by examples over the clients
    that reported a finite one (none under privacy modes that hide it: NaN)."""
    reported = [c for c in clients.values() if math.isfinite(c.train_loss)]
    seen = sum(c.num_examples for c in reported)
    loss = sum(c.train_loss * c.num_examples for c in reported) / seen if seen else math.nan
    messages = len(orders.cohort) + collected.hops
    return RoundRecord(
        round_idx=orders.round_idx,
        cohort_size=len(orders.cohort),
        train_loss=loss,
        test_accuracy=test_acc,
        test_loss=test_loss,
        bytes_up=collected.bytes_up,
        bytes_down=collected.bytes_down,
        paper_bytes=2 * FLOAT32_BYTES * exp.spec.size * messages,
        lr=orders.plan.lr,
        seconds=time.perf_counter() - t0,
        float32_up=collected.float32_up,
        float32_down=collected.float32_down,
    )


def _local_round(
    exp: Experiment,
    state: LoopState,
    round_idx: int,
    start: int,
    bar: Progress,
    hooks: RoundHooks,
    t0: float,
    store: RunStore | None,
) -> RoundRecord:
    """A round inside an upload period (``upload_every`` > 1): its cohort trains
    locally (the work is done with the period's last round), nothing travels."""
    cohort = sample(exp, start, None, state.selection)
    info = RoundInfo(
        exp, state, bar, round_idx, start, "local", list(cohort), [], state.params, store=store
    )
    hooks.round_start(info)
    record = _record_of_nothing(exp, round_idx, start, len(cohort), t0)
    hooks.round_end(info, RoundEnd(record, [], False))
    return record


def _record_of_nothing(
    exp: Experiment, round_idx: int, start: int, cohort_size: int, t0: float
) -> RoundRecord:
    """The row of a round in which nothing travelled."""
    return RoundRecord(
        round_idx=round_idx,
        cohort_size=cohort_size,
        train_loss=float("nan"),
        test_accuracy=None,
        test_loss=None,
        bytes_up=0,
        bytes_down=0,
        paper_bytes=0,
        lr=exp.algorithm.plan(start).lr,
        seconds=time.perf_counter() - t0,
        float32_up=0,
        float32_down=0,
    )

"""Buffered asynchronous aggregation (FedBuff, Nguyen et al. 2022; FedAsync,
Xie et al. 2019, is K = 1): its server steps, in the simulator on the virtual
clock.

Up to M clients (``asynchronous.concurrency``) are at work at once. A client
handed work trains at once on the model of that moment (its update is
computed then, by the run's engine) and its upload arrives at its start plus
its time on the virtual clock: ``systems/clock.py:client_time`` from its
profile, the real payload and update bytes and the examples of its local
epochs; without ``systems.profiles`` every client's work takes one virtual
second. A client of the profile's ``failure_prob`` fails before uploading
(drawn from (seed, round, client)); its slot frees when it would have uploaded.
With profiles only the clients online at the clock's time are handed work
(``systems/availability.py``; when nobody is at work and nobody online, the
clock waits for the first to come online), and one that goes offline before
its upload arrives drops out then, its slot freed.

Arrivals are taken in time order, ties by client id, into the round's
``Buffer`` (``collectors/buffer.py``) until K updates were taken; then the
server steps (the aggregate's stages, the server optimizer) and the round is
recorded: a round is one server step. Uploads that arrive at one instant are
all taken before any freed slot is filled, and a freed slot is given, by the
run's selection policy, to a client neither at work nor heard from since the
last step, with the newest model. The first draw of round r uses round r's
cohort generator, so with M = K = the cohort size and equal times every round
asks the synchronous round's cohort and computes its model, to the bit. When
no client can be handed work and none is at work, the round closes with the
updates it holds.

Each step's end is the run's virtual time after it (``LoopState.virtual_s``,
a ``round_clock`` row), as a synchronous round's on the clock, and each arrived
upload's seconds are its selection history's duration.

The state between steps (``buffered_state.py``) is checkpointed with the
loop's, so a resumed run delivers the same updates at the same times.

A deployment's engine fills the step's buffer over the network instead (its
``fill_buffer``, given the step's ``Filling``: ``transport/buffered_remote.py``);
the rest of the step (aggregate, server step, evaluation, record, hooks) is
the same.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from fedforge.aggregation.staleness import StalenessWeight
from fedforge.client.runtime import ClientTask
from fedforge.core.errors import ConfigError
from fedforge.core.rng import numpy_rng
from fedforge.report.progress import Progress
from fedforge.selection.named import SelectionRound
from fedforge.selection.sampling import cohort_rng
from fedforge.server.buffered_state import BufferedState, InFlight
from fedforge.server.builtin_hooks import run_hooks
from fedforge.server.cohort import checked_choice
from fedforge.server.collectors.base import RoundLog
from fedforge.server.collectors.buffer import Buffer
from fedforge.server.evaluate_round import evaluate_phase
from fedforge.server.experiment import Experiment
from fedforge.server.hooks import RoundEnd, RoundHooks, RoundInfo
from fedforge.server.round import (
    Orders,
    aggregate_phase,
    configure,
    round_record,
    server_step,
)
from fedforge.server.state import LoopState
from fedforge.store import ClientRecord, RoundRecord, RunStore
from fedforge.systems.clock import ClientTime, client_time
from fedforge.systems.population import population
from fedforge.systems.profile import ClientProfile

UNIT_S = 1.0  # a client's work on the virtual clock when the run has no profiles


def check_buffered(exp: Experiment) -> None:
    """What the built run must be for buffered aggregation (the config's rules are
    ``config/asynchronous.py:buffered_fits``): one line each."""
    if not exp.cfg.asynchronous.buffered:
        return
    said = "asynchronous.mode = 'fedbuff'"
    algorithm = exp.algorithm
    if algorithm.server is not None or algorithm.client is not None or algorithm.server_step:
        raise ConfigError(
            f"{said} with algorithm '{algorithm.name}': its server or per-client state "
            "assumes each update answers the server's current state"
        )
    if not exp.pipeline.streams:
        raise ConfigError(
            f"{said} needs a streaming mean (a linear aggregator and no cohort stage, "
            "e.g. robust.norm_gate): those stages judge a cohort trained from one model"
        )
    dep = exp.cfg.deployment
    if exp.engine.name != "remote":
        return
    if dep.cold_start or dep.canary_every > 0:
        raise ConfigError(
            f"{said} in fedforge server with deployment.cold_start or deployment.canary_every: "
            "their evaluations run between synchronous rounds; turn them off"
        )
    if exp.cfg.communication.error_feedback:
        raise ConfigError(
            f"{said} in fedforge server with communication.error_feedback: a client's "
            "residual is kept only when its update is used, which a step may learn long "
            "after the client moved on; turn it off"
        )
    if dep.over_selection > 0:
        raise ConfigError(
            f"{said} in fedforge server with deployment.over_selection = {dep.over_selection}: "
            "clients are handed work as they become free (asynchronous.concurrency); set it to 0"
        )


def run_buffered_round(
    exp: Experiment,
    state: LoopState,
    round_idx: int,
    bar: Progress,
    hooks: RoundHooks | None = None,
    store: RunStore | None = None,
) -> tuple[RoundRecord, list[ClientRecord]]:
    """One server step of buffered aggregation (the module's docstring), recorded
    as round ``round_idx``, with the run's ``hooks`` told as in a synchronous round
    (its cohort: the clients whose updates arrived in it, known at its end);
    ``store``: the run's, which the hooks may read."""
    t0 = time.perf_counter()
    hooks = hooks if hooks is not None else run_hooks()
    buffered = state.buffered
    if buffered is None:
        raise ValueError("run_buffered_round needs the loop state of a fedbuff run")
    cfg = exp.cfg
    info = RoundInfo(
        exp, state, bar, round_idx, round_idx, "upload", [], [], state.params, store=store
    )
    hooks.round_start(info)
    log = RoundLog(state.rejected, state.skipped, bar, round_idx, partial(_refused, hooks, info))
    orders = configure(exp, state, round_idx, round_idx, [])
    asyn = cfg.asynchronous
    size = asyn.buffer_size_of(cfg.num_clients, cfg.client_fraction)
    concurrency = asyn.concurrency_of(cfg.num_clients, cfg.client_fraction)
    weight = StalenessWeight.of(asyn)
    buffer = Buffer(
        exp, round_idx, log, len(orders.payload), orders.dense, orders.limits, size, weight,
        info.diagnostics,
    )  # fmt: skip
    filling = Filling(exp, state, buffered, orders, buffer, log, bar, concurrency)
    fill = getattr(exp.engine, "fill_buffer", None)  # a deployment's: over the network
    started_s = buffered.now
    heard, sent = fill(filling) if fill is not None else _fill_virtual(filling)
    buffer.end_phase()
    uploaded = sorted(e.client_id for e in heard if e.data is not None)
    finished = buffer.finish()
    for client_id, settle in filling.held:  # judged again at the end: their verdicts now
        settle(finished.refused_at_end.get(client_id))
    wire = exp.engine.sent_down()  # a deployment's bytes as they crossed the wire
    nbytes, downloads = wire if wire is not None else (len(orders.payload) * sent, sent)
    collected = dataclasses.replace(
        finished,
        arrived=frozenset(uploaded),
        bytes_down=nbytes,
        float32_down=orders.dense.down * downloads,
    )
    aggregate, clients, moved = aggregate_phase(exp, state, collected, log)
    clients = server_step(exp, state, aggregate, clients, moved, log)
    applied = not log.skipped_now
    info.cohort = info.trainers = uploaded
    hooks.taken(info, list(clients))
    state.remember_norms(collected, cfg)  # the next rounds' bounds
    traffic = collected.bytes_up + collected.bytes_down  # no proxy filling under FedBuff
    test_acc, test_loss = evaluate_phase(exp, state, round_idx, round_idx, info, hooks, traffic)
    asked = dataclasses.replace(orders, cohort=uploaded)
    record = round_record(exp, asked, collected, clients, test_acc, test_loss, t0)
    _outputs(state, round_idx, buffered.now, heard, buffer.taken_staleness() if applied else [])
    durations: dict[int, float] = {}
    if fill is None:  # the simulator's step on the virtual clock
        online = filling.online_at(started_s)
        state.outputs["round_clock"] = [
            (round_idx, started_s, buffered.now - started_s, buffered.now, online, len(heard),
             len(uploaded)),
        ]  # fmt: skip
        state.virtual_s.append(buffered.now)
        durations = {e.client_id: e.arrives - e.started for e in heard if e.data is not None}
    rows = list(clients.values())
    used = sorted(clients)
    end = RoundEnd(record, used, applied, uploaded, uploaded, rows, durations)
    hooks.round_end(info, end)
    return record, rows


def _refused(hooks: RoundHooks, info: RoundInfo, client_id: int, why: str) -> None:
    hooks.upload(info, client_id, False, why)


@dataclass
class Filling:
    """What fills one server step's buffer needs: the run, its state, the step's
    orders (model, plan, payload), the buffer, the step's log and M. A deployment's
    engine fills it over the network (``fill_buffer``), the simulator on its clock."""

    exp: Experiment
    state: LoopState
    buffered: BufferedState
    orders: Orders
    buffer: Buffer
    log: RoundLog
    bar: Progress
    concurrency: int
    # taken updates the buffer judges again at its end: (client, their uploader's verdict)
    held: list[tuple[int, Callable[[str | None], None]]] = field(default_factory=list)

    def draw(self, pool: list[int], size: int) -> list[int]:
        """``size`` clients of ``pool`` drawn by the run's selection policy; the
        step's first draw uses the round's cohort generator."""
        cfg, round_idx = self.exp.cfg, self.orders.round_idx
        draw = self.buffered.next_draw(round_idx)
        rng = (
            cohort_rng(cfg.seed, round_idx)
            if draw == 0
            else numpy_rng(cfg.seed, "cohort", round_idx, draw)
        )
        view = self.state.selection.view(self.exp.client_sizes())
        return checked_choice(self.exp, SelectionRound(round_idx, pool, size, view, rng))

    def online(self, clients: Iterable[int], t: float) -> list[int]:
        """Those of ``clients`` online at virtual time ``t`` (all, without profiles)."""
        systems = self.exp.systems
        if systems is None:
            return list(clients)
        return [c for c in clients if systems.availability.online(c, t)]

    def online_at(self, t: float) -> int:
        """How many clients are online at virtual time ``t``."""
        return len(self.online(range(self.exp.cfg.num_clients), t))

    def next_online(self, heard: set[int]) -> float:
        """The first time after now at which a client neither at work nor in
        ``heard`` comes online (inf: none, or the run has no availability)."""
        systems, now = self.exp.systems, self.buffered.now
        if systems is None:
            return math.inf
        idle = self.buffered.busy() | heard
        avail = systems.availability
        free = [c for c in range(self.exp.cfg.num_clients) if c not in idle]
        return min((avail.next_online(c, now) for c in free), default=math.inf)


def _fill_virtual(f: Filling) -> tuple[list[InFlight], int]:
    """The simulator's step: arrivals in time order until K were taken (the
    module's docstring). The clients heard from and how many were handed work."""
    buffered, buffer = f.buffered, f.buffer
    heard: list[InFlight] = []
    sent = 0
    while not buffer.full:
        nxt = buffered.next_arrival()
        free = f.concurrency - len(buffered.in_flight)
        if free > 0 and (nxt is None or nxt > buffered.now):  # this instant's uploads are in
            sent += _dispatch(f, free, {e.client_id for e in heard})
            nxt = buffered.next_arrival()
        if nxt is None and free > 0:  # nobody at work: wait for a client to come online
            later = f.next_online({e.client_id for e in heard})
            if buffered.now < later < math.inf:
                buffered.now = later
                continue
        if nxt is None:
            f.log.write(
                f"no client is at work and none may be handed work before the next step; "
                f"the buffer closes with {len(buffer.clients) + len(buffer.held)} of "
                f"{buffer.size}"
            )
            break
        entry = buffered.pop()
        buffered.now = entry.arrives
        heard.append(entry)
        if entry.data is not None:
            buffer.offer_from(entry.client_id, entry.version, entry.data)
    return heard, sent


def _dispatch(f: Filling, free: int, heard: set[int]) -> int:
    """Hand work to up to ``free`` clients neither at work nor in ``heard``, drawn
    by the run's selection policy, at the clock's time and on the round's model;
    their updates are computed now and wait for their arrival. How many went."""
    exp, buffered, orders = f.exp, f.buffered, f.orders
    cfg = exp.cfg
    round_idx = orders.round_idx
    busy = buffered.busy() | heard
    pool = f.online((c for c in range(cfg.num_clients) if c not in busy), buffered.now)
    size = min(free, len(pool))
    if size == 0:
        return 0
    cohort = f.draw(pool, size)
    sizes = exp.client_sizes()
    tasks = [ClientTask(c, round_idx, orders.plan, cfg.seed) for c in cohort]
    profiles = _profiles(exp, buffered, f.bar)
    down = len(orders.payload)
    for up in exp.engine.run_cohort(tasks, orders.payload):
        c = up.client_id
        if profiles is None:
            took = ClientTime(0.0, UNIT_S, 0.0)
        else:
            took = client_time(profiles[c], down, len(up.data), orders.plan.local_epochs * sizes[c])
        data: bytes | None = up.data
        arrives = buffered.now + took.total_s
        if profiles is not None and _fails(cfg.seed, round_idx, c, profiles[c].failure_prob):
            data, arrives = None, buffered.now + took.download_s + took.compute_s
        gone = _offline_at(exp, c, buffered.now)  # a client offline before its upload drops out
        if gone < arrives:
            data, arrives = None, gone
        start, parts = buffered.now, (took.download_s, took.compute_s, took.upload_s)
        buffered.push(InFlight(arrives, c, round_idx, start, *parts, data))
    return len(cohort)


def _offline_at(exp: Experiment, client_id: int, t: float) -> float:
    """When a client online at ``t`` goes offline (inf: never, or no availability)."""
    if exp.systems is None:
        return math.inf
    return exp.systems.availability.online_until(client_id, t)


def _fails(seed: int, round_idx: int, client_id: int, prob: float) -> bool:
    """Whether a client handed work in ``round_idx`` fails before its upload."""
    return prob > 0 and bool(numpy_rng(seed, "failure", round_idx, client_id).random() < prob)


def _profiles(
    exp: Experiment, buffered: BufferedState, bar: Progress
) -> list[ClientProfile] | None:
    """The run's profiles, read once a process; without them the run says how
    its clock counts."""
    if not buffered.loaded:
        buffered.profiles = population(exp.cfg)
        buffered.loaded = True
        if buffered.profiles is None:
            bar.write(
                "fedforge: fedbuff without systems.profiles: every client's work takes "
                f"{UNIT_S:g} virtual second; uploads at one instant are taken by client id"
            )
    return buffered.profiles


def _outputs(
    state: LoopState, round_idx: int, now: float, heard: list[InFlight], staleness: list[int]
) -> None:
    """The round's rows: each client heard from on the clock (``client_times``:
    seconds from its start; arrived 0, it failed) and the step's virtual time
    and staleness (``buffered_rounds``)."""
    state.outputs["client_times"] = [
        (
            round_idx,
            e.client_id,
            e.download_s,
            e.compute_s,
            e.upload_s if e.data is not None else math.nan,
            e.arrives - e.started,
            int(e.data is not None),
        )  # fmt: skip
        for e in sorted(heard, key=lambda e: e.client_id)
    ]
    mean = sum(staleness) / len(staleness) if staleness else math.nan
    most = max(staleness) if staleness else None
    state.outputs["buffered_rounds"] = [(round_idx, now, len(staleness), mean, most)]

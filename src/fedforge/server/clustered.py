"""One round of a clustered algorithm (``Algorithm.clusters``: CFL, IFCA;
algorithms/clustered.py): a model per cluster of clients.

    sample -> assign -> per cluster: configure, collect, aggregate, server step
           -> place the tied -> merge (close models) -> split (the rule)
           -> evaluate -> record

The cohort is sampled as in any round; the rule puts each cohort client in a
cluster; each cluster's clients are one cohort of their own, trained on the
cluster's model (its own payload) and averaged into it by the same phases as
``round.py``'s (``configure``, ``collect``, ``aggregate_phase``,
``server_step``), the rows gathered (``ClusterCohort``) so the rule can split
the cluster by its clients' updates. A client whose update is taken is placed
in the cluster it trained in, except one whose choice of model was a tie
(``Assignment.tied``): its update is averaged in but left out of the split's
comparison, and once every cluster has stepped it is placed in the live
cluster whose model now has the lowest loss on its data (left unplaced if that
is still a tie). Clusters whose models come close merge; a split moves the
clients compared to its two halves and unplaces the cluster's absent members
(``ClusterTable.split``).
The run's global model (``state.params``: the record's test figures, the final
model) is the model of the cluster with the most clients; each client is
evaluated with its own cluster's model (``evaluation.clients``; per cluster in
``group_eval``, attribute ``cluster``). The hooks are told of the round once,
with the whole cohort. Runs in the simulator; a deployment is refused when
built (loop.py).
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial

import torch

from fedforge.algorithms.clusters import Clustering, ClusterTable
from fedforge.evaluation.clients import training_losses
from fedforge.report.progress import Progress
from fedforge.server.builtin_hooks import run_hooks
from fedforge.server.cohort import sample
from fedforge.server.collect import collect
from fedforge.server.collectors import Collected, GatheredCohort, RoundLog
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
from fedforge.server.stops import round_bytes
from fedforge.store import ClientRecord, RoundRecord, RunStore


class ClusterCohort(GatheredCohort):
    """The gathered collector, keeping the used clients' rows for the rule's split."""

    kept: tuple[list[int], torch.Tensor, torch.Tensor] | None = None

    def _aggregate(self) -> tuple[torch.Tensor | None, dict[int, float]]:
        aggregate, used = super()._aggregate()
        ups = [u for u in self.gathering.uploads if u.client_id in used]
        if aggregate is not None and ups:
            rows = torch.stack([u.delta.clone() for u in ups])
            weights = torch.tensor([u.weighed() for u in ups], dtype=torch.float64)
            self.kept = ([u.client_id for u in ups], rows, weights)
        return aggregate, used


def _tell_refused(hooks: RoundHooks, info: RoundInfo, client_id: int, why: str) -> None:
    hooks.upload(info, client_id, False, why)


def rule_of(exp: Experiment) -> Clustering:
    rule = exp.algorithm.clusters
    assert rule is not None
    return rule


def run_clustered_round(
    exp: Experiment,
    state: LoopState,
    round_idx: int,
    bar: Progress,
    hooks: RoundHooks | None = None,
    store: RunStore | None = None,
) -> tuple[RoundRecord, list[ClientRecord]]:
    """One round of the module docstring, the ``hooks`` told as in ``run_round``."""
    t0 = time.perf_counter()
    hooks = hooks if hooks is not None else run_hooks()
    rule = rule_of(exp)
    table = ClusterTable({k: v.clone() for k, v in state.algorithm_state.items()})
    if not table.live():  # the run's first round
        rule.begin(table, state.params, exp.cfg.seed)
    losses_fn = partial(training_losses, exp)
    cohort = sample(exp, round_idx, None, state.selection)
    assigned, tied = rule.assign(table, round_idx, cohort, losses_fn)
    info = RoundInfo(
        exp,
        state,
        bar,
        round_idx,
        round_idx,
        "upload",
        list(cohort),
        list(cohort),
        state.params,
        store=store,
    )
    hooks.round_start(info)
    askable = hooks.askable(info, cohort)
    log = RoundLog(
        state.rejected, state.skipped, bar, round_idx, partial(_tell_refused, hooks, info)
    )
    exp.engine.begin_round(round_idx)
    parts: list[tuple[Orders, Collected]] = []
    clients: dict[int, ClientRecord] = {}
    splits: list[tuple[int, tuple[list[int], list[int]]]] = []
    for j in sorted(set(assigned.values())):
        members = [c for c in cohort if assigned[c] == j]
        state.params = table.models[j].clone()
        orders = configure(exp, state, round_idx, round_idx, members)
        collector = ClusterCohort(
            exp, round_idx, members, log, len(orders.payload), orders.dense, orders.limits, None
        )
        got = collect(exp, collector, orders.tasks, orders.payload, round_idx, None, askable)
        aggregate, taken, moved = aggregate_phase(exp, state, got, log)
        taken = server_step(exp, state, aggregate, taken, moved, log)
        if taken:
            table.models[j] = state.params
            table.cluster_of[sorted(set(taken) - tied)] = j
            if collector.kept is not None:
                ids, updates, weights = _placed_rows(collector.kept, tied)
                halves = rule.split(round_idx, ids, updates, weights)
                if halves is not None:
                    splits.append((j, halves))
        clients.update(taken)
        parts.append((orders, got))
    for c in sorted(tied & clients.keys()):  # the models have moved since they chose
        j, alone = table.pick(c, losses_fn)
        if alone:
            table.cluster_of[c] = j
    for a, b in table.merge(rule.merge_below):  # before the splits: their halves are equal
        bar.write(f"fedforge: round {round_idx + 1}: clusters {a} and {b} merged (models close)")
    for j, (first, second) in splits:  # each half goes on from the cluster's model
        if not int(table.alive[j]):  # merged into another this round
            continue
        k = table.split(j, first, second)
        if k is None:
            bar.write(f"fedforge: cluster {j} would split; all {len(table.alive)} slots used")
            continue
        bar.write(
            f"fedforge: round {round_idx + 1}: cluster {j} split, {len(second)} clients to {k}"
        )
    state.algorithm_state = table.state()
    state.params = table.models[table.largest()].clone()
    rule.table = table
    hooks.taken(info, list(clients))
    orders, collected = _together(parts, cohort)
    state.remember_norms(collected, exp.cfg)  # the next rounds' bounds
    state.outputs.update(exp.engine.end_round(round_idx, sorted(clients)))
    traffic = round_bytes(exp, state, collected, cohort)
    test_acc, test_loss = evaluate_phase(exp, state, round_idx, round_idx, info, hooks, traffic)
    record = round_record(exp, orders, collected, clients, test_acc, test_loss, t0)
    used = sorted(clients)
    rows = list(clients.values())
    applied = bool(clients)
    arrived = sorted(collected.arrived)
    hooks.round_end(info, RoundEnd(record, used, applied, arrived, arrived, rows))
    return record, rows


def _placed_rows(
    kept: tuple[list[int], torch.Tensor, torch.Tensor], tied: frozenset[int]
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The kept rows less the tied clients': a cluster splits by its own clients'
    updates, not by those of clients that trained its model for want of a choice."""
    ids, updates, weights = kept
    rows = [i for i, c in enumerate(ids) if c not in tied]
    if len(rows) == len(ids):
        return kept
    return [ids[i] for i in rows], updates[rows], weights[rows]


def _together(parts: list[tuple[Orders, Collected]], cohort: list[int]) -> tuple[Orders, Collected]:
    """The clusters' orders and collections as one round's (bytes summed)."""
    first_orders, first = parts[0]
    orders = dataclasses.replace(first_orders, cohort=list(cohort))
    total = dataclasses.replace(
        first,
        received=[r for _, c in parts for r in c.received],
        bytes_up=sum(c.bytes_up for _, c in parts),
        bytes_down=sum(c.bytes_down for _, c in parts),
        float32_up=sum(c.float32_up for _, c in parts),
        float32_down=sum(c.float32_down for _, c in parts),
        hops=sum(c.hops for _, c in parts),
        arrived=frozenset().union(*(c.arrived for _, c in parts)),
        norms={k: v for _, c in parts for k, v in c.norms.items()},
        clip_norms={k: v for _, c in parts for k, v in c.clip_norms.items()},
    )
    return orders, total

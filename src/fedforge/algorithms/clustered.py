"""Clustered aggregation: a model per cluster of clients, for populations one
model cannot fit (a concept shift: the same input, different labels).

- ``cfl``: Clustered Federated Learning, Sattler, Mueller, Samek 2020 (IEEE
  TNNLS), Algorithm 1. Every client starts in one cluster. After a cluster's
  round, when its weighted mean update is small (``mean_norm_below``) while
  some client's update is large (``max_norm_above``), the cluster is split in
  two by the cosine similarities of its clients' updates (complete-linkage
  bipartition, clusters.py), if no pair across the halves is more similar than
  ``max_cross_cosine`` (the paper's separation check); each half continues
  from the cluster's model and may split again (recursive). Only the clients
  whose updates were compared are split; the cluster's members absent from
  that round are unplaced until they next train (below).
- ``ifca``: the Iterative Federated Clustering Algorithm, Ghosh, Chung, Yin,
  Ramchandran 2020 (NeurIPS), Algorithm 2 with model averaging: ``clusters``
  models; each round every cohort client trains the model with the lowest loss
  on its training data, and each model is averaged over the clients that chose
  it. Model j > 0 starts as the run's initial model with the entries of every
  tensor shuffled by (seed, "ifca", j): the initial distribution, drawn anew.

Both merge two clusters whose models come within ``merge_below`` of each other
(relative distance) and serve each client its cluster's model, in training and
in evaluation (``evaluation.clients``: per-cluster rows in ``group_eval``
under attribute ``cluster``).

Decisions (this code, not the papers): the losses a client compares are
computed where the simulator holds its data, as the client would compute them
(``evaluation/clients.py``'s ``training_losses``, IFCA's as well); a client
placed in no cluster (CFL: not trained yet, or absent when its cluster split)
is served the live model with the lowest loss on its data, and once its update
is taken it is placed in that model's cluster, as IFCA picks. Where that lowest
loss is shared (the round after a split, its two clusters still hold the same
model) the client trains the lower slot's model and is placed after the round
by the losses of the models the round left (``assign``'s ``tied``). Runs in the
simulator (any engine: each cluster is one cohort of its own); the deployment,
secure aggregation, DP, buffered rounds, upload periods and stateful server
optimizers are refused (one line each, ``check_clustered``). Trusts what
FedAvg trusts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from fedforge.algorithms.base import Algorithm, cross_entropy
from fedforge.algorithms.clusters import (
    Assignment,
    ClusterTable,
    LossesFn,
    bipartition,
    cosine_matrix,
)
from fedforge.algorithms.factories import local_plan
from fedforge.algorithms.plan import DecayedPlan, LocalPlan
from fedforge.algorithms.terms import StatelessServerTerms
from fedforge.config.clusters import CflOptions, IfcaOptions
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.core.rng import torch_generator

if TYPE_CHECKING:
    from fedforge.config import Config
    from fedforge.config.components import ComponentContext


class ClusterState(StatelessServerTerms):
    """The cluster table as the algorithm's server state (checkpointed); nothing
    in the payload, nothing carried by the updates."""

    def __init__(self, num_clients: int, max_clusters: int) -> None:
        super().__init__()
        self.num_clients, self.max_clusters = num_clients, max_clusters

    def initial_state(self, size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return ClusterTable.initial_state(self.num_clients, self.max_clusters, size, dtype)


class Cfl:
    """Sattler et al.'s split rule (``Clustering``)."""

    name = "cfl"

    def __init__(self, options: CflOptions) -> None:
        self.options = options
        self.max_clusters = options.max_clusters
        self.merge_below = options.merge_below
        self.table: ClusterTable | None = None

    def begin(self, table: ClusterTable, params: torch.Tensor, seed: int) -> None:
        table.open(params.clone())

    def assign(
        self, table: ClusterTable, round_idx: int, cohort: Sequence[int], losses_fn: LossesFn
    ) -> Assignment:
        cluster, tied = {}, set()
        for c in cohort:
            own = int(table.cluster_of[c])
            if own >= 0 and int(table.alive[own]):
                cluster[c] = own
                continue
            cluster[c], alone = table.pick(c, losses_fn)
            if not alone:
                tied.add(c)
        return Assignment(cluster, frozenset(tied))

    def split(
        self,
        round_idx: int,
        client_ids: Sequence[int],
        updates: torch.Tensor,
        weights: torch.Tensor,
    ) -> tuple[list[int], list[int]] | None:
        o = self.options
        if round_idx + 1 <= o.warmup_rounds or len(client_ids) < 2 * o.min_size:
            return None
        u = updates.to(torch.float64)
        w = weights.to(torch.float64) / weights.to(torch.float64).sum()
        mean_norm = float((w @ u).norm())
        max_norm = float(u.norm(dim=1).max())
        if not (mean_norm < o.mean_norm_below and max_norm > o.max_norm_above):
            return None
        similarity = cosine_matrix(u)
        first, second = bipartition(similarity)
        if min(len(first), len(second)) < o.min_size:
            return None
        if float(similarity[first][:, second].max()) >= o.max_cross_cosine:
            return None  # the halves still pull alike: not two distributions
        return [client_ids[i] for i in first], [client_ids[i] for i in second]


class Ifca:
    """Ghosh et al.'s rule (``Clustering``): k models, each client picks by loss."""

    name = "ifca"

    def __init__(self, options: IfcaOptions, spec: ParamSpec) -> None:
        self.k = options.clusters
        self.max_clusters = options.clusters
        self.merge_below = options.merge_below
        self.spec = spec
        self.table: ClusterTable | None = None

    def begin(self, table: ClusterTable, params: torch.Tensor, seed: int) -> None:
        table.open(params.clone())
        for j in range(1, self.k):
            table.open(shuffled(params, self.spec, seed, j))

    def assign(
        self, table: ClusterTable, round_idx: int, cohort: Sequence[int], losses_fn: LossesFn
    ) -> Assignment:
        return Assignment({c: table.closest(c, losses_fn) for c in cohort})

    def split(
        self,
        round_idx: int,
        client_ids: Sequence[int],
        updates: torch.Tensor,
        weights: torch.Tensor,
    ) -> tuple[list[int], list[int]] | None:
        return None


def shuffled(params: torch.Tensor, spec: ParamSpec, seed: int, j: int) -> torch.Tensor:
    """``params`` with the entries of each tensor permuted by (seed, "ifca", j)."""
    out = params.clone()
    gen = torch_generator(seed, "ifca", j)
    for view in spec.views(out).values():
        flat = view.reshape(-1)
        flat.copy_(flat[torch.randperm(flat.numel(), generator=gen)])
    return out


def clustered(
    rule: Cfl | Ifca, plan: LocalPlan, num_clients: int, lr_decay: float = 1.0
) -> Algorithm:
    """FedAvg's local training and mean within each cluster of ``rule``."""
    return Algorithm(
        rule.name,
        DecayedPlan(plan, lr_decay),
        cross_entropy,
        server=ClusterState(num_clients, rule.max_clusters),
        clusters=rule,
    )


def check_clustered(name: str, cfg: Config) -> None:
    """Refuse in one line what a model per cluster cannot run with."""
    p = cfg.privacy
    rules = [
        ("privacy.secagg", p.secagg, "the server must see each client's update"),
        ("privacy.dp", p.dp != "none", "its noise and accounting are for one model"),
        ("privacy.tiers", p.tiers.enabled, "its noise and accounting are for one model"),
        ("asynchronous.mode", cfg.asynchronous.buffered, "its steps serve one model"),
        (
            "communication.upload_every",
            cfg.communication.upload_every > 1,
            "a period trains one model",
        ),
        ("communication.groups", cfg.communication.groups > 0, "edges average one model"),
        (
            "server_optimizer",
            cfg.server_optimizer.kind != "sgd" or cfg.server_optimizer.momentum > 0,
            "its state would mix the clusters' steps",
        ),
        ("systems", cfg.systems.enabled, "the virtual clock times one payload a round"),
    ]
    for field, bad, why in rules:
        if bad:
            raise ConfigError(f"algorithm {name!r} cannot run with {field} set: {why}")


def cfl_factory(context: ComponentContext) -> Algorithm:
    cfg = context.cfg
    check_clustered("cfl", cfg)
    options = context.options if context.options is not None else CflOptions()
    return clustered(Cfl(options), local_plan(cfg), cfg.num_clients, cfg.lr_decay)


def ifca_factory(context: ComponentContext) -> Algorithm:
    cfg, spec = context.cfg, context.spec
    if spec is None:
        raise ValueError("IFCA needs the model's spec to draw its models")
    check_clustered("ifca", cfg)
    options = context.options if context.options is not None else IfcaOptions()
    return clustered(Ifca(options, spec), local_plan(cfg), cfg.num_clients, cfg.lr_decay)

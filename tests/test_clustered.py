"""Clustered aggregation (algorithms/clustered.py, algorithms/clusters.py,
server/clustered.py) and the concept-shift partition (data/concept.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedforge import resume, run
from fedforge.algorithms.clustered import Cfl, check_clustered
from fedforge.algorithms.clusters import ClusterTable, bipartition, cosine_matrix
from fedforge.config import from_dict, override
from fedforge.config.clusters import CflOptions
from fedforge.core.errors import ConfigError
from fedforge.data import Partition, from_tensors
from fedforge.data.concept import assign_groups, label_maps, relabel
from fedforge.engines.serial import SerialEngine
from fedforge.server.hooks import RoundEnd, RoundHook, RoundInfo
from fedforge.store import RunStore
from fedforge.store.final import load_final

pytestmark = pytest.mark.usefixtures("one_thread")


def test_label_maps_relabel_each_clients_rows_by_its_group_by_hand() -> None:
    maps = label_maps(3, 4, seed=5)
    assert maps[0].tolist() == [0, 1, 2, 3]  # group 0: the test set's own labels
    for g in (1, 2):  # a derangement each, the two distinct
        assert sorted(maps[g].tolist()) == [0, 1, 2, 3]
        assert all(maps[g][c] != c for c in range(4))
    assert maps[1].tolist() != maps[2].tolist()
    # two clients, client 1 in group 1 with the swap map of two classes
    y = torch.tensor([0, 1, 1, 0, 1, 1, 0])
    part = Partition((np.array([0, 1, 2]), np.array([3, 4, 6])))
    swap = np.array([[0, 1], [1, 0]])
    out = relabel(y, part, (0, 1), swap)
    # row 5 belongs to nobody: unchanged; client 1's rows 3, 4, 6 swapped
    assert out.tolist() == [0, 1, 1, 1, 0, 1, 1]
    assert y.tolist() == [0, 1, 1, 0, 1, 1, 0]  # a copy
    groups = assign_groups(7, 3, seed=1)
    assert sorted(np.bincount(groups).tolist()) == [2, 2, 3]  # balanced within one


def test_concept_shift_reaches_training_and_held_out_rows() -> None:
    """Through the run's data: each client's training and held-out labels are its
    group's map of the rows' true labels."""
    x, y, part = _blobs(clients=4, per_client=20)
    data = from_tensors(x, y, x[:10], y[:10], part, num_classes=2)
    cfg = _config("fedavg", concept_shift=2, rounds=1)
    from fedforge.server.experiment import build

    exp = build(cfg, data)
    maps = label_maps(2, 2, cfg.seed)
    groups = assign_groups(4, 2, cfg.seed)
    assert exp.data.concepts == groups
    for c in range(4):
        for idx in (exp.data.partition.client_indices[c], exp.data.holdout.client_indices[c]):
            rows = torch.from_numpy(np.array(idx, dtype=np.int64))
            want = torch.from_numpy(maps[groups[c]])[y[rows]]
            assert exp.data.train_y[rows].tolist() == want.tolist()
    assert exp.data.client_tags()["concept"] == tuple(f"map{g}" for g in groups)


def test_cfl_splits_two_groups_with_opposite_updates() -> None:
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(50, generator=gen)
    ups = torch.stack(
        [(1 if c in (0, 2, 3) else -1) * v + 0.1 * torch.randn(50, generator=gen) for c in range(6)]
    )
    ids = [10, 11, 12, 13, 14, 15]
    rule = Cfl(CflOptions(mean_norm_below=1.0, max_norm_above=1.0, warmup_rounds=0, min_size=2))
    halves = rule.split(3, ids, ups, torch.ones(6))
    assert halves == ([10, 12, 13], [11, 14, 15])
    # congruent updates (all alike) are not split, whatever the norms
    assert rule.split(3, ids, ups.abs() + 1.0, torch.ones(6)) is None
    # a large mean update: the cluster is not near its stationary point
    assert rule.split(3, ids, ups + 10 * v, torch.ones(6)) is None
    # within the warm-up rounds nothing splits
    early = Cfl(CflOptions(mean_norm_below=1.0, max_norm_above=1.0, warmup_rounds=5, min_size=2))
    assert early.split(3, ids, ups, torch.ones(6)) is None


def test_bipartition_is_complete_linkage_as_scipy_computes_it() -> None:
    hierarchy = pytest.importorskip("scipy.cluster.hierarchy")
    from scipy.spatial.distance import squareform

    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        sim = cosine_matrix(torch.randn(9, 6, generator=gen))
        first, second = bipartition(sim)
        dist = (1 - sim).clamp_min(0).numpy()
        np.fill_diagonal(dist, 0)
        labels = hierarchy.fcluster(
            hierarchy.linkage(squareform(dist, checks=False), "complete"), 2, "maxclust"
        )
        theirs = sorted(
            (sorted(np.flatnonzero(labels == k).tolist()) for k in (1, 2)), key=lambda g: g[0]
        )
        assert [first, second] == theirs


def test_merge_joins_close_centres_weighted_by_members() -> None:
    state = ClusterTable.initial_state(num_clients=5, max_clusters=4, size=2, dtype=torch.float64)
    table = ClusterTable(state)
    a = table.open(torch.tensor([10.0, 0.0], dtype=torch.float64))
    b = table.open(torch.tensor([10.0, 0.05], dtype=torch.float64))  # distance 0.005
    c = table.open(torch.tensor([0.0, 10.0], dtype=torch.float64))
    table.cluster_of[:] = torch.tensor([a, b, b, b, c])
    assert table.merge(0.0) == []  # 0: never
    assert table.merge(0.01) == [(0, 1)]
    # 1 member at [10, 0] and 3 at [10, 0.05]: the mean [10, 0.0375]
    assert torch.allclose(table.models[0], torch.tensor([10.0, 0.0375], dtype=torch.float64))
    assert table.cluster_of.tolist() == [0, 0, 0, 0, 2]
    assert table.live() == [0, 2]
    assert table.models[2].tolist() == [0.0, 10.0]  # far: untouched


@pytest.mark.parametrize("algorithm", ["ifca", "cfl"])
def test_clusters_found_are_the_label_maps(algorithm: str) -> None:
    """Two groups with swapped labels: each algorithm ends with the groups as its
    clusters, and every client's cluster model fits its own labels, which the
    one FedAvg model cannot do for both groups."""
    x, y, part = _blobs(clients=8, per_client=60)
    data = from_tensors(x, y, x[:10], y[:10], part, num_classes=2)
    groups = assign_groups(8, 2, 0)
    scores = {}
    for name in (algorithm, "fedavg"):
        res = run(_config(name, concept_shift=2, rounds=12), data=data)
        final = load_final(res.run_dir)
        with RunStore.open(res.run_dir) as store:
            rows = [r for r in store.read_rows("client_eval") if r[0] == 11]
            groups_eval = [r for r in store.read_rows("group_eval") if r[0] == 11]
        scores[name] = min(r[2] for r in rows)
        per_cluster = [r for r in groups_eval if r[1] == "cluster"]
        if name != "fedavg":
            of = final["personal"]["cluster_of"].tolist()
            assert len(set(of)) == 2
            assert all(
                (of[i] == of[j]) == (groups[i] == groups[j]) for i in range(8) for j in range(8)
            )
            # per-cluster evaluation: a row a cluster, its clients with its model
            assert sorted(r[2] for r in per_cluster) == sorted(f"c{j}" for j in set(of))
            assert sum(r[6] for r in per_cluster) == 8 and min(r[3] for r in per_cluster) > 0.9
        else:
            assert per_cluster == []
    assert scores[algorithm] > 0.9 and scores["fedavg"] < 0.7


def test_a_stopped_cfl_run_resumes_to_the_same_clusters(run_stopped: Any, tmp_path: Path) -> None:
    """The cluster table is checkpointed with the run: stopped after its split and
    resumed, the run ends with the uninterrupted run's models and clusters."""
    x, y, part = _blobs(clients=8, per_client=60)
    data = from_tensors(x, y, x[:10], y[:10], part, num_classes=2)
    cfg = override(_config("cfl", concept_shift=2, rounds=6), {"runs_dir": str(tmp_path)})
    whole = load_final(run(cfg, data=data).run_dir)
    stopped = run_stopped(override(cfg, {"checkpoint_every": 1}), data, 4)
    assert stopped.stopped is not None
    again = load_final(resume(stopped.run_dir, data=data).run_dir)
    assert torch.equal(again["params"], whole["params"])
    for key in ("cluster_models", "cluster_of", "cluster_alive"):
        assert torch.equal(again["personal"][key], whole["personal"][key])
    assert int(whole["personal"]["cluster_alive"].sum()) == 2  # it split before the stop


def test_a_split_unplaces_the_members_absent_from_it_and_a_tie_is_told() -> None:
    table = ClusterTable(ClusterTable.initial_state(6, 3, 2, torch.float64))
    table.open(torch.tensor([1.0, 0.0], dtype=torch.float64))
    table.cluster_of[:] = torch.tensor([0, 0, 0, 0, -1, 0])
    k = table.split(0, [0, 2], [1])  # clients 3 and 5 were not compared
    assert k == 1 and torch.equal(table.models[1], table.models[0])
    assert table.cluster_of.tolist() == [0, 1, 0, -1, -1, -1]
    by_hand = {3: [2.0, 2.0], 5: [3.0, 1.0]}  # (client, models) -> losses
    assert table.pick(3, lambda c, models: by_hand[c]) == (0, False)  # a tie: lower slot
    assert table.pick(5, lambda c, models: by_hand[c]) == (1, True)
    full = ClusterTable(ClusterTable.initial_state(2, 1, 2, torch.float64))
    full.open(torch.zeros(2, dtype=torch.float64))
    full.cluster_of[:] = 0
    assert full.split(0, [0], [1]) is None and full.cluster_of.tolist() == [0, 0]


class _Clusters(RoundHook):
    """Each round's cohort, the clients taken, and the cluster table after it."""

    name = "clusters"

    def __init__(self) -> None:
        self.rounds: list[tuple[list[int], list[int], list[int], int]] = []

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        state = info.state.algorithm_state
        alive = int(state["cluster_alive"].sum())
        self.rounds.append((sorted(info.cohort), end.used, state["cluster_of"].tolist(), alive))


def test_cfl_clients_absent_at_a_split_join_their_label_maps_cluster(
    run_stopped: Any, tmp_path: Path
) -> None:
    """Half the clients a round: a client away when its cluster split is placed,
    after the next round it trains in, in the cluster of the clients sharing its
    label map (the test knows each client's map); the first round after the split
    (both halves still hold one model) included. Stopped after the split and
    resumed, the run ends with the same clusters."""
    x, y, part = _blobs(clients=12, per_client=40)
    data = from_tensors(x, y, x[:10], y[:10], part, num_classes=2)
    cfg = override(
        _config("cfl", concept_shift=2, rounds=8),
        {"num_clients": 12, "client_fraction": 0.5, "runs_dir": str(tmp_path)},
    )
    groups = assign_groups(12, 2, cfg.seed)
    seen = _Clusters()
    whole = load_final(run(cfg, data=data, hooks=[seen]).run_dir)
    alive = [a for *_, a in seen.rounds]
    split = alive.index(2)  # the round whose end split the one cluster in two
    cohort, compared, _, _ = seen.rounds[split]
    absent = [c for c in range(12) if c not in cohort]
    assert {groups[c] for c in absent} == {0, 1}  # one group's absent must move
    tied = 0
    for c in absent:
        after = next(r for r in range(split + 1, len(seen.rounds)) if c in seen.rounds[r][1])
        tied += after == split + 1
        of = seen.rounds[after][2]
        mates = {of[m] for m in compared if groups[m] == groups[c]}
        others = {of[m] for m in compared if groups[m] != groups[c]}
        assert len(mates) == 1 and mates != others, (c, after, of)
        assert of[c] in mates, (c, after, of)
    assert tied > 0  # the losses tie in the round after the split
    assert alive[split:] == [2] * (len(alive) - split)  # no half split again
    stopped = run_stopped(override(cfg, {"checkpoint_every": 1}), data, split + 2)
    assert stopped.stopped is not None
    again = load_final(resume(stopped.run_dir, data=data).run_dir)
    for key in ("cluster_models", "cluster_of", "cluster_alive"):
        assert torch.equal(again["personal"][key], whole["personal"][key])


def test_clustered_refuses_what_serves_one_model() -> None:
    cfg = from_dict({"algorithm": "cfl", "privacy": {"secagg": True, "dp": "central"}})
    with pytest.raises(ConfigError, match="'cfl' cannot run with privacy.secagg set"):
        check_clustered("cfl", cfg)
    # a deployment's engine (the network's) is refused before any round
    remote = SerialEngine(None)  # type: ignore[arg-type]
    remote.name = "remote"
    x, y, part = _blobs(clients=4, per_client=20)
    data = from_tensors(x, y, x[:10], y[:10], part, num_classes=2)
    with pytest.raises(ConfigError, match="'ifca' runs in the simulator"):
        run(_config("ifca", concept_shift=2, rounds=1), data=data, store=False, engine=remote)
    with pytest.raises(ConfigError, match="partition.concept_shift"):
        from_dict({"partition": {"concept_shift": 1}})


def _blobs(clients: int, per_client: int) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    """Two well-separated blobs in 2-D, label 1 on the right, IID over clients."""
    gen = torch.Generator().manual_seed(0)
    n = clients * per_client
    y = torch.arange(n) % 2
    x = torch.randn(n, 2, generator=gen) * 0.5
    x[:, 0] += torch.where(y == 1, 2.0, -2.0)
    part = [np.arange(c * per_client, (c + 1) * per_client) for c in range(clients)]
    return x, y, part


def _config(algorithm: str, concept_shift: int, rounds: int):  # type: ignore[no-untyped-def]
    return from_dict(
        {
            "name": f"clustered-{algorithm}",
            "model": "logreg",
            "algorithm": algorithm,
            "num_clients": 8 if rounds > 1 else 4,
            "partition": {"kind": "iid", "concept_shift": concept_shift},
            "client_fraction": 1.0,
            "local_epochs": 2,
            "batch_size": 10,
            "lr": 0.5,
            "rounds": rounds,
            "target_accuracy": None,
            "engine": "serial",
            "evaluation": {"every": 1, "clients": True, "holdout": 0.25},
            "plugin_options": {
                "cfl": {"warmup_rounds": 2, "mean_norm_below": 10.0, "max_norm_above": 0.01},
            }
            if algorithm == "cfl"
            else {},
        }
    )

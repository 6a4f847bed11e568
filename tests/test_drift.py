"""Drift (config/drift.py, data/drift.py): the labels clients train on, and the
test set is scored with, pass through the label map of the round's phase.
The schedule against a hand example, the labels a client really trains on,
the test score on the current phase, serial == vectorised in float64, a resume
across a phase boundary bit-identical, and the config's one-line refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedforge.algorithms import LocalPlan
from fedforge.client.runtime import ClientTask
from fedforge.config import describe_split, from_dict, override
from fedforge.core.errors import ConfigError
from fedforge.core.rng import torch_generator
from fedforge.data import Partition
from fedforge.data.concept import label_maps
from fedforge.data.drift import DriftSchedule, class_weights
from fedforge.data.federated import FederatedData
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run
from fedforge.store import RunStore, list_checkpoints
from fedforge.tasks import Task

DRIFT = {"kind": "label_map", "every": 2, "groups": 3}
# a float64 2NN federation of 6 clients, 3 a round, 4 rounds: phases 0, 0, 1, 1
SMALL: dict[str, Any] = {
    "model": "2nn", "num_clients": 6, "client_fraction": 0.5, "local_epochs": 2,
    "batch_size": 4, "lr": 0.05, "rounds": 4, "target_accuracy": None,
    "evaluation": {"every": 1}, "dtype": "float64", "checkpoint_every": 0, "drift": DRIFT,
}  # fmt: skip


def learnable_data(sizes: list[int], num_test: int = 40, seed: int = 0) -> FederatedData:
    """Random 28x28 inputs whose label is the argmax of 10 fixed random
    projections (a task a 2NN learns in a few rounds), client k holding the next
    ``sizes[k]`` rows."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.randn(n + num_test, 1, 28, 28, generator=gen, dtype=torch.float64)
    w = torch.randn(784, 10, generator=gen, dtype=torch.float64)
    y = (x.flatten(1) @ w).argmax(dim=1)
    bounds = np.cumsum([0, *sizes])
    parts = tuple(np.arange(bounds[k], bounds[k + 1]) for k in range(len(sizes)))
    return FederatedData(x[:n], y[:n], x[n:], y[n:], Partition(parts), num_classes=10)


SIZES = [9, 14, 6, 11, 8, 12]


# --------------------------------------------------------------------------- schedule


def test_schedule_by_hand() -> None:
    """every = 3, 3 maps: rounds 0-2 phase 0 (identity), 3-5 map 1, 6-8 map 2,
    9-11 the identity again; a label y reads as maps[g][y]."""
    maps = torch.from_numpy(label_maps(3, 10, seed=7, stream="drift"))
    schedule = DriftSchedule("label_map", 3, maps)
    want = {0: 0, 2: 0, 3: 1, 5: 1, 6: 2, 8: 2, 9: 0, 11: 0, 12: 1}
    assert {r: schedule.group(r) for r in want} == want
    assert [schedule.phase(r) for r in (0, 2, 3, 8, 9)] == [0, 0, 1, 2, 3]
    y = torch.tensor([0, 3, 9, 3, 5])
    for r, g in want.items():
        by_hand = torch.tensor([int(maps[g][int(v)]) for v in y])
        assert torch.equal(schedule.labels(y, r), by_hand)
    assert torch.equal(schedule.labels(y, 0), y)
    assert all(bool((maps[g] != torch.arange(10)).all()) for g in (1, 2))  # derangements


def test_maps_come_from_the_seed_and_their_own_stream() -> None:
    """The same seed draws the same maps; another seed, or the concept shift's
    stream, others (a run with both has two independent sets)."""
    drift = label_maps(4, 10, seed=3, stream="drift")
    assert np.array_equal(drift, label_maps(4, 10, seed=3, stream="drift"))
    assert not np.array_equal(drift, label_maps(4, 10, seed=4, stream="drift"))
    assert not np.array_equal(drift, label_maps(4, 10, seed=3))


def test_class_weights_favour_each_class_in_one_group() -> None:
    """label_mix, 3 groups of 10 classes: each class weighs ``strength`` in exactly
    one group and 1 in the others; the groups hold 4, 3 and 3 classes."""
    table = class_weights(3, 10, strength=5.0, seed=2)
    assert table.shape == (3, 10)
    assert ((table == 5.0).sum(dim=0) == 1).all() and ((table == 1.0).sum(dim=0) == 2).all()
    assert sorted((table == 5.0).sum(dim=1).tolist()) == [3, 3, 4]
    assert not torch.equal(table, class_weights(3, 10, strength=5.0, seed=3))


def test_label_mix_redraws_a_clients_rows_each_phase_by_the_groups_weights() -> None:
    """A client of 3,000 rows, labels 0..9 in turn: its rows of a round are its own
    rows, as many, the same through a phase and others in the next; the share
    of the favoured classes is sum(s n_c) / (sum(s n_c) + sum(n_c)) over favoured
    and other classes, to within 4 standard deviations."""
    strength, n = 4.0, 3000
    table = class_weights(2, 10, strength, seed=0)
    schedule = DriftSchedule("label_mix", 5, table, seed=0)
    x = torch.arange(n, dtype=torch.float64).unsqueeze(1)  # a row's x is its index
    y = torch.arange(n) % 10
    rows = {r: schedule.client_rows(x, y, r, client=7) for r in (0, 4, 5, 10)}
    for r, (rx, ry) in rows.items():
        assert len(ry) == n and torch.equal(y[rx[:, 0].long()], ry)
        favoured = table[schedule.group(r)] == strength
        share = float(favoured[ry].double().mean())
        per_class = n / 10
        want = 5 * strength * per_class / (5 * strength * per_class + 5 * per_class)
        assert abs(share - want) < 4 * (want * (1 - want) / n) ** 0.5, (r, share, want)
    assert torch.equal(rows[0][0], rows[4][0])  # one phase: the same draw
    assert not torch.equal(rows[0][0], rows[10][0])  # same group, another phase
    other = schedule.client_rows(x, y, 0, client=8)[0]
    assert not torch.equal(rows[0][0], other)  # another client, another draw


# --------------------------------------------------------------------------- the run


def test_a_client_trains_on_its_labels_through_the_rounds_map() -> None:
    data = learnable_data(SIZES)
    exp = build(from_dict(SMALL), data)
    maps = torch.from_numpy(label_maps(3, 10, seed=0, stream="drift"))
    runtime = exp.engine.runtime  # type: ignore[attr-defined]
    plan = LocalPlan(lr=0.05, local_epochs=1, batch_size=4)
    for round_idx, g in [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (6, 0)]:
        x, y = runtime.client_data(ClientTask(2, round_idx, plan, 0))
        own_x, own_y = data.client_data(2)
        assert torch.equal(x, own_x)
        assert torch.equal(y, maps[g][own_y])


def _accuracy(
    exp: Any, params: torch.Tensor, labels: torch.Tensor, x: torch.Tensor | None = None
) -> float:
    """The share of the rows ``x`` (the test set's by default) whose argmax is
    ``labels``, computed here."""
    exp.spec.load_into(exp.model, params)
    with torch.no_grad():
        guess = exp.model(exp.data.test_x if x is None else x).argmax(dim=1)
    return float((guess == labels).double().mean())


def test_the_test_set_is_scored_on_the_current_phase() -> None:
    """The last round (2 of 0..2, phase 1) is scored against the test labels
    through map 1; the same model scored on the labels as they are differs."""
    data = learnable_data(SIZES)
    cfg = from_dict({**SMALL, "rounds": 3, "engine": "serial"})
    got = run(cfg, data=data, store=False)
    exp = build(cfg, data)
    maps = torch.from_numpy(label_maps(3, 10, seed=0, stream="drift"))
    mapped = _accuracy(exp, got.params, maps[1][data.test_y])
    plain = _accuracy(exp, got.params, data.test_y)
    assert got.rounds[-1].test_accuracy == pytest.approx(mapped, abs=1e-12)
    assert mapped != plain
    # the round before (1 of 0..1, phase 0) is scored through map 0
    before = run(override(cfg, {"rounds": 2}), data=data, store=False)
    first = _accuracy(exp, before.params, maps[0][data.test_y])
    assert before.rounds[-1].test_accuracy == pytest.approx(first, abs=1e-12)
    assert first != _accuracy(exp, before.params, maps[1][data.test_y])


def test_label_mix_scores_the_phases_redrawn_test_rows() -> None:
    """The last round (phase 1) is scored on the test rows redrawn from (seed,
    "drift-mix", 1, "test") by group 1's class weights, drawn here by hand."""
    data = learnable_data(SIZES)
    cfg = from_dict({**SMALL, "rounds": 3, "engine": "serial", "drift": {
        "kind": "label_mix", "every": 2, "groups": 2, "strength": 8.0}})  # fmt: skip
    got = run(cfg, data=data, store=False)
    exp = build(cfg, data)
    weights = class_weights(2, 10, 8.0, seed=0)[1][data.test_y]
    gen = torch_generator(0, "drift-mix", 1, "test")
    idx = torch.multinomial(weights, len(weights), replacement=True, generator=gen)
    x, y = data.test_x[idx], data.test_y[idx]
    assert got.rounds[-1].test_accuracy == pytest.approx(_accuracy(exp, got.params, y, x))
    with torch.no_grad():  # the mean cross-entropy, on the drawn rows and on all
        drawn = float(torch.nn.functional.cross_entropy(exp.model(x), y))
        plain = float(torch.nn.functional.cross_entropy(exp.model(data.test_x), data.test_y))
    assert got.rounds[-1].test_loss == pytest.approx(drawn, abs=1e-12)
    assert abs(drawn - plain) > 1e-6


@pytest.mark.parametrize("kind", ["label_map", "label_mix"])
def test_vectorized_equals_serial_float64_with_drift(kind: str) -> None:
    data = learnable_data(SIZES)
    base = from_dict({**SMALL, "drift": {**DRIFT, "kind": kind}})
    serial = run(override(base, {"engine": "serial"}), data=data, store=False)
    vector = run(override(base, {"engine": "vectorized"}), data=data, store=False)
    still = run(override(base, {"engine": "serial", "drift.kind": "none"}), data=data, store=False)
    assert vector.summary["engine"] == "vectorized"
    assert (serial.params - vector.params).abs().max().item() < 1e-9
    for a, b in zip(serial.rounds, vector.rounds, strict=True):
        assert a.train_loss == pytest.approx(b.train_loss, abs=1e-12)
        assert a.test_accuracy == pytest.approx(b.test_accuracy, abs=1e-12)
    assert (serial.params - still.params).abs().max().item() > 1e-4  # the drift mattered


@pytest.mark.all_cores
def test_the_pool_engine_drifts_as_the_serial_one() -> None:
    """The cohort spread over 2 forked processes (engines/pool.py), each a serial
    runtime: the same parameters as one process."""
    data = learnable_data(SIZES)
    base = from_dict({**SMALL, "engine": "serial"})
    one = run(base, data=data, store=False)
    pool = run(override(base, {"workers": 2}), data=data, store=False)
    assert pool.summary["engine"] == "serialx2"
    assert torch.equal(one.params, pool.params)


@pytest.mark.slow
def test_the_ray_engine_drifts_as_the_serial_one() -> None:
    """Ray workers run the pickled runtime, its schedule with it: each upload as
    the serial engine's, so the parameters are equal bit for bit (~7 s: a local
    cluster of 2 CPUs)."""
    ray = pytest.importorskip("ray")
    cfg = {
        "dataset": "synthetic", "model": "logreg", "num_clients": 30, "client_fraction": 0.4,
        "rounds": 4, "lr": 0.02, "dtype": "float64", "threads": 1, "target_accuracy": None,
        "checkpoint_every": 0, "drift": {"kind": "label_map", "every": 2, "groups": 2},
    }  # fmt: skip
    serial = run(from_dict({**cfg, "engine": "serial"}), store=False)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        spread = {"workers": 2, "aggregate_on_workers": False}
        got = run(from_dict({**cfg, "engine": "ray", "ray": spread}), store=False)
    finally:
        ray.shutdown()
    assert got.summary["engine"] == "rayx2"
    assert torch.equal(got.params, serial.params)
    assert [r.test_accuracy for r in got.rounds] == [r.test_accuracy for r in serial.rounds]


@pytest.mark.parametrize("kind", ["label_map", "label_mix"])
def test_resume_across_a_phase_boundary_is_bit_identical(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed as round 3 starts (checkpoint after round 1, phase 0): the resume
    trains rounds 2 and 3 in phase 1 to the uninterrupted run's parameters and
    per-round losses, bit for bit."""
    from tests.test_resume import _crashed_run

    data = learnable_data(SIZES)
    base = {**SMALL, "checkpoint_every": 2, "engine": "serial", "drift": {**DRIFT, "kind": kind}}
    want = run(from_dict({**base, "runs_dir": str(tmp_path / "a")}), data)
    run_dir = _crashed_run(monkeypatch, {**base, "runs_dir": str(tmp_path / "b")}, data, 3)
    assert [p.name for p in list_checkpoints(run_dir)] == ["round-000002"]
    got = resume(run_dir, data=data)
    assert torch.equal(got.params, want.params)
    assert [r.test_loss for r in got.rounds] == [r.test_loss for r in want.rounds]
    assert [r.train_loss for r in got.rounds] == [r.train_loss for r in want.rounds]
    with RunStore.open(run_dir) as store:
        assert len(store.rounds()) == 4 and store.status == "finished"


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"drift": {"kind": "label_map", "groups": 1}}, "'drift.groups' = 1"),
        ({"drift": {"kind": "label_map", "groups": 11}}, "'drift.groups' = 11"),
        ({"drift": {"kind": "label_map", "every": 0}}, "'drift.every' = 0"),
        ({"drift": {"kind": "shuffle"}}, "'drift.kind' = 'shuffle'"),
        ({"drift": {"kind": "label_mix", "strength": 0.5}}, "'drift.strength' = 0.5"),
        ({"task": "shakespeare-lstm"}, "dataset = 'shakespeare'"),
        ({"evaluation": {"clients": True}}, "evaluation.clients = True"),
        ({"evaluation": {"validation": 0.1}}, "evaluation.validation = 0.1"),
        ({"diagnostics": {"loss_gap": True}}, "diagnostics.loss_gap = True"),
        ({"robust": {"client_gate": True}}, "robust.client_gate = True"),
        ({"aggregation": {"weights": "class"}}, "aggregation.weights = 'class'"),
        (
            {"deployment": {"client_data": "remote"}, "robust": {"max_weight_ratio": 10}},
            "deployment.client_data = 'remote'",
        ),
        ({"asynchronous": {"mode": "fedbuff"}}, "asynchronous.buffered = True"),
        ({"proxy": {"size": 100, "tune_epochs": 1}}, "proxy.tune_epochs = True"),
        ({"deployment": {"canary_every": 2}}, "deployment.canary_every = 2"),
        ({"deployment": {"cold_start": True}}, "deployment.cold_start = True"),
        ({"communication": {"upload_every": 3}}, "communication.upload_every = 3"),
    ],
)
def test_bad_drift_configs_are_refused_in_one_line(fields: dict[str, Any], said: str) -> None:
    cfg = {"drift": {"kind": "label_map", "every": 2, "groups": 2}, **fields}
    with pytest.raises(ConfigError) as err:
        from_dict(cfg)
    text = str(err.value)
    assert said in text and "\n" not in text, text


def test_the_split_in_words_says_the_drift() -> None:
    cfg = from_dict({"drift": {"kind": "label_map", "every": 5, "groups": 3}})
    plain = describe_split(override(cfg, {"drift.kind": "none"}))
    assert describe_split(cfg) == f"{plain}, drifting: 3 label maps in turn, 5 rounds each"
    mix = override(cfg, {"drift.kind": "label_mix"})
    assert describe_split(mix) == (
        f"{plain}, drifting: the label mix favours 3 class groups in turn (4x), 5 rounds each"
    )


def test_an_upload_period_dividing_the_phase_is_taken() -> None:
    cfg = from_dict(
        {"drift": {"kind": "label_map", "every": 4}, "communication": {"upload_every": 2}}
    )
    assert cfg.communication.upload_every == 2


@pytest.mark.parametrize(
    ("fields", "task", "said"),
    [
        ({"drift": {"kind": "label_mix", "groups": 4}}, None, "drift.groups = 4 is invalid"),
        ({}, "sequence", "this run's task is 'sequence'"),
    ],
)
def test_what_the_data_cannot_drift_is_refused_at_build(
    fields: dict[str, Any], task: str | None, said: str
) -> None:
    """label_mix with more groups than the data's classes (3 here), and a
    caller's task whose rows are not one class id each."""
    data = learnable_data(SIZES)
    train_y, test_y = data.train_y % 3, data.test_y % 3
    if task == "sequence":  # two steps a row
        train_y, test_y = train_y.repeat(2, 1).T, test_y.repeat(2, 1).T
    data = FederatedData(
        data.train_x, train_y, data.test_x, test_y, data.partition, num_classes=3
    )  # fmt: skip
    cfg = from_dict({**SMALL, **fields})
    given = None if task is None else Task("sequence-task", kind=task)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        build(cfg, data, given)
    text = str(err.value)
    assert said in text and "\n" not in text, text


def test_a_clustered_algorithm_is_refused_in_one_line() -> None:
    cfg = from_dict({**SMALL, "algorithm": "ifca"})
    with pytest.raises(ConfigError) as err:
        build(cfg, learnable_data(SIZES))
    text = str(err.value)
    assert "algorithm 'ifca' cannot run with drift.kind = 'label_map'" in text, text
    assert "\n" not in text

"""The engine contract (DESIGN idea 4): the vectorised engine computes what the
serial engine computes. Same config and seed, float64, final parameters equal
to 1e-9, for both McMahan models, IID and quantity-skewed (uneven) clients."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from fedforge import config as config_mod
from fedforge.aggregation.mean import WeightedMean
from fedforge.algorithms import LocalPlan, fedavg
from fedforge.client.runtime import ClientRuntime
from fedforge.core import wire
from fedforge.core.params import ParamSpec
from fedforge.data import iid, quantity_skew
from fedforge.data.federated import FederatedData
from fedforge.engines.serial import SerialEngine
from fedforge.engines.vectorized import (
    VectorizedEngine,
    _step_indices,
    chunk_size,
    client_bytes,
    schedule_bytes,
    unsupported_reason,
)
from fedforge.server.engine_choice import make_engine
from fedforge.server.experiment import build
from fedforge.server.loop import run


def synthetic_data(num_clients: int, sizes: str, seed: int = 0) -> FederatedData:
    """Random 28x28 'digits' whose label depends on the pixels, split over clients."""
    gen = torch.Generator().manual_seed(seed)
    n = 60
    x = torch.randn(n, 1, 28, 28, generator=gen, dtype=torch.float64)
    y = (x.mean(dim=(1, 2, 3)) * 40).long().clamp(-4, 5) + 4
    rng = np.random.default_rng(seed)
    partition = (
        iid(n, num_clients, rng)
        if sizes == "iid"
        else quantity_skew(n, num_clients, sigma=1.0, rng=rng, min_size=2)
    )
    return FederatedData(x, y, x[:40], y[:40], partition, num_classes=10)  # as MNIST


@pytest.mark.parametrize("model", ["2nn", "cnn"])
@pytest.mark.parametrize("sizes", ["iid", "quantity"])
def test_vectorized_equals_serial_float64(model: str, sizes: str) -> None:
    data = synthetic_data(6, sizes)
    if sizes == "quantity":
        assert len(set(data.partition.sizes().tolist())) > 2  # really uneven
    base = config_mod.Config(
        model=model,
        num_clients=6,
        client_fraction=0.5,
        local_epochs=1 if model == "cnn" else 2,
        batch_size=4,
        lr=0.05,
        rounds=3,
        target_accuracy=None,
        evaluation=config_mod.EvaluationConfig(every=3),
        dtype="float64",
    )
    serial = run(config_mod.override(base, {"engine": "serial"}), data=data, store=False)
    vector = run(config_mod.override(base, {"engine": "vectorized"}), data=data, store=False)
    assert vector.summary["engine"] == "vectorized"
    moved = (serial.params - build(base, data).initial_params).abs().max().item()
    assert moved > 1e-4  # training really changed the model
    diff = (serial.params - vector.params).abs().max().item()
    assert diff < 1e-9, diff
    for a, b in zip(serial.rounds, vector.rounds, strict=True):
        assert a.train_loss == pytest.approx(b.train_loss, abs=1e-12)
        assert a.bytes_down == b.bytes_down
        # updates differ only in the printed digits of the float train_loss
        assert abs(a.bytes_up - b.bytes_up) <= 8 * a.cohort_size


def test_full_batch_uneven_clients_match_serial() -> None:
    """B = infinity with clients of different sizes: padding to the widest
    client must not change any client's gradient."""
    data = synthetic_data(5, "quantity", seed=3)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10)).double()
    spec = ParamSpec.of(model)
    alg = fedavg(LocalPlan(3, None, 0.3))
    runtime = ClientRuntime(model, spec, alg, data.client_data)
    from fedforge.client.runtime import ClientTask
    from fedforge.core import wire

    payload = wire.encode({"params": spec.flatten(model, torch.float64)})
    tasks = [ClientTask(c, 0, alg.plan(0), 11) for c in range(5)]
    a = [wire.decode(u.data) for u in SerialEngine(runtime).run_cohort(tasks, payload)]
    b = [wire.decode(u.data) for u in VectorizedEngine(runtime).run_cohort(tasks, payload)]
    for ma, mb in zip(a, b, strict=True):
        assert ma.meta["steps"] == mb.meta["steps"] == 3
        assert torch.allclose(ma.tensors["delta"], mb.tensors["delta"], atol=1e-13, rtol=0)
        assert ma.meta["train_loss"] == pytest.approx(mb.meta["train_loss"], abs=1e-12)
    agg = WeightedMean().aggregate(
        torch.stack([m.tensors["delta"] for m in b]),
        torch.tensor([float(m.meta["num_examples"]) for m in b]),
    )
    assert torch.isfinite(agg).all()


@pytest.mark.parametrize("batch_size", [None, 3])
@pytest.mark.parametrize("momentum", [0.0, 0.9])  # fused batched path, vmap path
def test_a_client_without_examples_takes_no_step_on_either_engine(
    batch_size: int | None, momentum: float
) -> None:
    """Zero examples: no minibatch, so no step (weight decay would still move the
    model on an empty batch), a loss of 0 and steps 0, on both engines."""
    from fedforge.client.runtime import ClientTask, minibatches

    assert minibatches(0, batch_size, torch.Generator()) == []
    data = synthetic_data(3, "iid", seed=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10)).double()
    spec = ParamSpec.of(model)
    alg = fedavg(LocalPlan(2, batch_size, 0.1, momentum=momentum, weight_decay=momentum / 9))

    def data_fn(client: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = data.client_data(client)
        return (x[:0], y[:0]) if client == 1 else (x, y)

    runtime = ClientRuntime(model, spec, alg, data_fn)
    payload = wire.encode({"params": spec.flatten(model, torch.float64)})
    for clients in ([0, 1, 2], [1]):  # a chunk with only the empty client too
        tasks = [ClientTask(c, 0, alg.plan(0), 11) for c in clients]
        for engine in (SerialEngine(runtime), VectorizedEngine(runtime)):
            ups = {
                t.client_id: wire.decode(u.data)
                for t, u in zip(tasks, engine.run_cohort(tasks, payload), strict=True)
            }
            empty = ups[1]
            assert empty.meta["steps"] == 0 and empty.meta["train_loss"] == 0.0
            assert torch.count_nonzero(empty.tensors["delta"]) == 0
            if 0 in ups:
                assert ups[0].meta["steps"] > 0


def test_step_indices_pad_and_mask() -> None:
    """Hand example: client 0 has batches [0,1],[2]; client 1 has [1]. Padding
    points at the zero row (index 9) and is masked."""
    schedules = [[torch.tensor([0, 1]), torch.tensor([2])], [torch.tensor([1])]]
    index, mask = _step_indices(schedules, offsets=[0, 3], pad_row=9)
    assert index.tolist() == [[[0, 1], [4, 9]], [[2, 9], [9, 9]]]
    assert mask.tolist() == [[[True, True], [True, False]], [[True, False], [False, False]]]


def test_chunk_size_respects_budget() -> None:
    # 4 bytes * (4 * 1000 + 4 * 50 * 10) = 24,000 bytes per client
    assert chunk_size(1000, 50, 10, 4, budget=240_000, limit=64) == 10
    assert chunk_size(1000, 50, 10, 4, budget=1, limit=64) == 1
    assert chunk_size(1000, 50, 10, 4, budget=10**12, limit=64) == 64


def test_chunks_are_sized_by_their_widest_client_and_their_data() -> None:
    """Full batch, a small client first: the chunk was sized on it, then every
    client padded to the largest (2x a 2 GiB budget on MNIST FedSGD). Now each
    client added costs as much as the widest so far, plus its data; an empty
    client first no longer crashes the sizing."""
    from fedforge.client.runtime import ClientTask

    sizes = [0, 2, 3, 40, 2, 2]
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 1, 28, 28, generator=gen, dtype=torch.float64) for n in sizes]
    ys = [torch.zeros(n, dtype=torch.int64) for n in sizes]
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10)).double()
    spec = ParamSpec.of(model)
    alg = fedavg(LocalPlan(1, None, 0.1))
    runtime = ClientRuntime(model, spec, alg, lambda c: (xs[c], ys[c]))
    act = 784 + 784 + 10  # the input, its flattened view, the logits

    def cost(count: int, width: int, clients: range) -> int:
        data = sum(2 * (xs[c].numel() * 8 + ys[c].numel() * 8) for c in clients)
        schedule = 700 + 17 * width  # one full batch: a step's tensor, its slots
        return count * (client_bytes(spec.size, act, width, 8) + schedule) + data

    budget = cost(3, 3, range(3))  # three clients as wide as 3 fit, not a fourth of 40
    engine = VectorizedEngine(runtime, memory_budget=budget)
    tasks = [ClientTask(c, 0, alg.plan(0), 1) for c in range(len(sizes))]
    chunks, lo = [], 0
    while lo < len(tasks):
        got = engine._take_chunk(tasks, lo)
        chunks.append([len(y) for _, y in got])
        lo += len(got)
    assert chunks == [[0, 2, 3], [40], [2, 2]]
    assert cost(2, 40, range(3, 5)) > budget  # a small client after the large one waits
    serial = [
        wire.decode(u.data) for u in SerialEngine(runtime).run_cohort(tasks, _payload(spec, model))
    ]
    vector = [wire.decode(u.data) for u in engine.run_cohort(tasks, _payload(spec, model))]
    for a, b in zip(serial, vector, strict=True):
        assert torch.allclose(a.tensors["delta"], b.tensors["delta"], rtol=0, atol=1e-12)


def test_schedule_bytes_by_hand() -> None:
    assert schedule_bytes(600, 10, 1) == 60 * (700 + 17 * 10)
    assert schedule_bytes(605, 10, 2) == 2 * 61 * (700 + 17 * 10)  # a short last batch
    assert schedule_bytes(5, None, 3) == 3 * (700 + 17 * 5)  # one full batch an epoch
    assert schedule_bytes(4, 10, 1) == 700 + 17 * 4  # a batch no wider than the client
    assert schedule_bytes(0, 10, 7) == 0


def test_chunks_are_cut_by_their_schedules() -> None:
    """Many local epochs: every client's minibatch schedule is built before its
    chunk trains, so it counts against the budget like its parameters."""
    from fedforge.client.runtime import ClientTask

    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(20, 1, 28, 28, generator=gen, dtype=torch.float64) for _ in range(6)]
    ys = [torch.zeros(20, dtype=torch.int64) for _ in range(6)]
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10)).double()
    spec = ParamSpec.of(model)
    alg = fedavg(LocalPlan(500, 2, 0.01))
    runtime = ClientRuntime(model, spec, alg, lambda c: (xs[c], ys[c]))
    per = client_bytes(spec.size, 784 + 784 + 10, 2, 8) + schedule_bytes(20, 2, 500)
    data = 2 * (20 * 784 * 8 + 20 * 8)
    assert schedule_bytes(20, 2, 500) > 3 * client_bytes(spec.size, 784 + 784 + 10, 2, 8)
    engine = VectorizedEngine(runtime, memory_budget=3 * (per + data))
    tasks = [ClientTask(c, 0, alg.plan(0), 1) for c in range(6)]
    assert len(engine._take_chunk(tasks, 0)) == 3  # 3 fit; without schedules all 6 did


def test_a_schedule_past_the_memory_budget_takes_the_serial_engine() -> None:
    """``local_epochs: 1e9`` grew the vectorised engine's schedule lists until the
    machine ran out of memory; the serial engine draws an epoch at a time."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    spec = ParamSpec.of(model)
    for epochs, name in ((10**9, "serial"), (100, "vectorized")):
        runtime = ClientRuntime(model, spec, fedavg(LocalPlan(epochs, 10, 0.1)), lambda c: c)
        engine, note = make_engine("vectorized", runtime, largest_client=600)
        assert engine.name == name
        assert (note is not None and "1000000000 local epochs" in note) == (name == "serial")
        assert make_engine("auto", runtime, largest_client=600)[0].name == name


def _payload(spec: ParamSpec, model: nn.Module) -> bytes:
    return wire.encode({"params": spec.flatten(model, torch.float64)})


def test_batch_norm_model_falls_back_to_serial_with_reason() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.LazyLinear(10))
    assert "batch-norm running statistics" in (unsupported_reason(model) or "")
    runtime = ClientRuntime(
        model, ParamSpec.of(nn.Linear(1, 1)), fedavg(LocalPlan(1, 1, 0.1)), lambda c: c
    )
    engine, note = make_engine("vectorized", runtime)
    assert engine.name == "serial"
    assert note is not None and "batch-norm" in note
    with pytest.raises(ValueError, match="batch-norm"):
        VectorizedEngine(runtime)


@pytest.mark.parametrize(
    ("model", "algorithm", "expected"),
    [("2nn", "fedavg", "vectorized"), ("logreg", "fedprox", "vectorized"),
     ("cnn", "fedavg", "serial"), ("cnn_bn", "fedavg", "serial"), ("cnn_bn", "fedbn", "serial")],
)  # fmt: skip
def test_auto_engine_picks_the_faster_engine_that_can_run(
    model: str, algorithm: str, expected: str
) -> None:
    """engine: auto (the default): vectorised for models without convolutions
    (measured faster there), serial for convolutions, batch norm and FedBN."""
    cfg = config_mod.Config(
        model=model, algorithm=algorithm, num_clients=6, target_accuracy=None,
        dataset="synthetic" if model == "logreg" else "mnist", dtype="float64",
    )  # fmt: skip
    assert cfg.engine == "auto"
    data = synthetic_data(6, "iid") if model != "logreg" else None
    exp = build(cfg, data)
    assert exp.engine.name == expected
    assert "engine" not in (exp.note or "")  # auto never complains: it picks what can run


def fused_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records the ``terms`` argument of every call of the fused path."""
    from fedforge.engines import batched_mlp, vectorized

    calls: list[object] = []
    real = batched_mlp.batched_mlp_sgd

    def counting(*args: object, **kw: object) -> object:
        calls.append(args[-1])
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(vectorized, "batched_mlp_sgd", counting)
    return calls


@pytest.mark.parametrize("sizes", ["iid", "quantity"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fused_perceptron_path_equals_vmap_and_serial(
    sizes: str, momentum: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 2NN's batched-matmul path (engines/batched_mlp.py) is taken for plain
    SGD and skipped otherwise (momentum: vmap path); both equal the serial engine
    in float64, uneven clients and several epochs included."""
    calls = fused_calls(monkeypatch)
    data = synthetic_data(6, sizes, seed=2)
    base = config_mod.Config(
        model="2nn", num_clients=6, client_fraction=0.5, local_epochs=3, batch_size=4,
        lr=0.05, rounds=2, target_accuracy=None,
        evaluation=config_mod.EvaluationConfig(every=2), dtype="float64",
        local=config_mod.LocalConfig(momentum=momentum),
    )  # fmt: skip
    serial = run(config_mod.override(base, {"engine": "serial"}), data=data, store=False)
    vector = run(config_mod.override(base, {"engine": "vectorized"}), data=data, store=False)
    assert (len(calls) > 0) == (momentum == 0.0)
    torch.testing.assert_close(vector.params, serial.params, rtol=0, atol=1e-9)
    for a, b in zip(serial.rounds, vector.rounds, strict=True):
        assert a.train_loss == pytest.approx(b.train_loss, abs=1e-12)


@pytest.mark.parametrize("sizes", ["iid", "quantity"])
@pytest.mark.parametrize("algorithm", ["fedprox", "scaffold"])
def test_fused_path_runs_fedprox_and_scaffold_terms_like_serial(
    sizes: str, algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FedProx's proximal gradient and SCAFFOLD's correction are folded into the
    fused update (engines/batched_mlp.py); the result is the serial engine's,
    which adds them through the algorithms' gradient hooks, in float64 over
    3 rounds (SCAFFOLD's controls nonzero from round 2 on)."""
    from fedforge.engines import batched_mlp

    calls = fused_calls(monkeypatch)
    data = synthetic_data(6, sizes, seed=4)
    base = config_mod.Config(
        model="2nn", num_clients=6, client_fraction=0.5, local_epochs=2, batch_size=4,
        lr=0.05, rounds=3, target_accuracy=None,
        evaluation=config_mod.EvaluationConfig(every=3), dtype="float64",
        algorithm=algorithm,
        fedprox=config_mod.FedProxConfig(mu=0.5 if algorithm == "fedprox" else 0.0),
    )  # fmt: skip
    serial = run(config_mod.override(base, {"engine": "serial"}), data=data, store=False)
    vector = run(config_mod.override(base, {"engine": "vectorized"}), data=data, store=False)
    assert calls, "the fused path was not taken"
    terms = calls[-1]
    assert isinstance(terms, batched_mlp.Terms)
    if algorithm == "fedprox":
        assert terms.mu == 0.5
    else:
        assert terms.correction is not None and terms.correction.abs().max() > 0
    plain = run(
        config_mod.override(base, {"engine": "serial", "algorithm": "fedavg"}),
        data=data,
        store=False,
    )
    assert (plain.params - serial.params).abs().max() > 1e-6  # the terms matter here
    torch.testing.assert_close(vector.params, serial.params, rtol=0, atol=1e-9)


@pytest.mark.parametrize("k", [1, 3])
def test_fused_path_leaves_start_alone_and_each_client_to_itself(k: int) -> None:
    """A chunk of one client trains copies of the global weights, never ``start``
    itself (a [1, ...] view made contiguous is the same tensor), and each client's
    result does not depend on the others in its chunk."""
    from fedforge.engines.batched_mlp import batched_mlp_sgd
    from fedforge.models import build_model

    model = build_model("2nn", 0).double()
    spec = ParamSpec.of(model)
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    before = start.clone()
    gen = torch.Generator().manual_seed(0)
    x_all = torch.rand(3 * 8 + 1, 1, 28, 28, generator=gen, dtype=torch.float64)
    x_all[-1] = 0.0  # the padding row
    y_all = torch.randint(0, 10, (3 * 8 + 1,), generator=gen)
    index = torch.stack([torch.randperm(8, generator=gen).view(2, 4) + 8 * c for c in range(3)], 1)
    mask = torch.ones(index.shape, dtype=torch.bool)
    mask[1, 1, 2:] = False  # client 1's second batch is short
    index[1, 1, 2:] = len(y_all) - 1
    mask[1, 0] = False  # client 0 takes one step: the chunk trains it last
    index[1, 0] = len(y_all) - 1
    layers = ["fc1", "fc2", "fc3"]
    together, loss = batched_mlp_sgd(
        layers, spec, start, x_all, y_all, index[:, :k], mask[:, :k], 0.1
    )
    assert torch.equal(start, before)
    for c in range(k):
        alone, loss_c = batched_mlp_sgd(
            layers, spec, start, x_all, y_all, index[:, c : c + 1], mask[:, c : c + 1], 0.1
        )
        torch.testing.assert_close(together[c], alone[0], rtol=0, atol=1e-12)
        assert float(loss[c]) == pytest.approx(float(loss_c[0]), abs=1e-12)
        assert (alone[0] - start).abs().max() > 1e-4  # it trained
    assert torch.equal(start, before)
    # a chunk whose clients have no example at all: no step, start as it was
    none, zero = batched_mlp_sgd(
        layers, spec, start, x_all, y_all, index[:0, :k], mask[:0, :k], 0.1
    )
    assert none.shape == (k, spec.size) and all(torch.equal(r, start) for r in none)
    assert zero.tolist() == [0.0] * k


def test_fused_chunks_hold_what_stays_in_cache(one_thread: None) -> None:
    """The perceptron path takes 8 2NN clients a chunk on one thread (6.5 MB of
    their 796,840-byte weights); the vmap path (momentum) is not limited."""
    from fedforge.engines import vectorized

    cfg = config_mod.Config(model="2nn", num_clients=6, engine="vectorized", dtype="float32")
    data = synthetic_data(6, "iid")
    data = dataclasses.replace(data, train_x=data.train_x.float(), test_x=data.test_x.float())
    exp = build(cfg, data)
    engine = exp.engine
    assert isinstance(engine, VectorizedEngine)
    plan = exp.algorithm.plan(0)
    assert exp.spec.size * 4 == 796_840
    assert engine._fused_limit(plan) == vectorized.FUSED_CACHE_BYTES // 796_840 == 8
    momentum = dataclasses.replace(plan, momentum=0.9)
    assert engine._fused_limit(momentum) == engine.max_chunk

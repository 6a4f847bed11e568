"""Issue 4 part B.1: FedBN (Li et al. 2021) -- batch norm stays with each client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData

from conftest import RunStopped
from fedforge.algorithms.fedbn import LocalBatchNorm, local_mask
from fedforge.client.runtime import ClientTask, encode_payload, local_sgd, minibatch_generator
from fedforge.config import from_dict, override
from fedforge.core import wire
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.data.federated import FederatedData
from fedforge.models import build_model
from fedforge.report.progress import Progress
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run
from fedforge.server.round import run_round
from fedforge.server.state import LoopState
from fedforge.store import MemoryStateStore, RunStore, list_checkpoints

F64 = torch.float64
BASE: dict[str, Any] = {
    "model": "cnn_bn",
    "algorithm": "fedbn",
    "num_clients": 5,
    "client_fraction": 0.6,
    "local_epochs": 1,
    "batch_size": 8,
    "lr": 0.05,
    "rounds": 4,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data([20, 12, 17, 9, 14], dtype=F64)


def _cfg(**extra: Any) -> Any:
    return from_dict({**BASE, **extra})


def test_cnn_bn_spec_has_batchnorm_and_running_statistics() -> None:
    model = build_model("cnn_bn", 0, F64)
    spec = ParamSpec.of(model, include_buffers=True)
    kinds = {e.name: e.kind for e in spec.entries}
    assert kinds["bn1.weight"] == kinds["bn2.bias"] == "batchnorm"
    assert kinds["bn2.running_mean"] == kinds["bn2.running_var"] == "buffer"
    assert kinds["conv1.weight"] == kinds["fc2.bias"] == "weight"
    mask = local_mask(spec)
    bn = sum(e.numel for e in spec.entries if e.kind != "weight")
    assert int(mask.sum()) == bn == 4 * (16 + 32)
    # the flat vector round-trips the running statistics too
    model.bn1.running_mean.fill_(3.0)
    vec = spec.flatten(model, F64)
    assert torch.equal(spec.views(vec)["bn1.running_mean"], torch.full((16,), 3.0, dtype=F64))


def test_new_client_starts_from_global_batchnorm() -> None:
    mask = torch.tensor([False, True, True, False])
    store = MemoryStateStore(3, 2, F64)
    bn = LocalBatchNorm(mask, store)
    glob = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    assert torch.equal(bn.start(1, glob), glob)  # never seen: the global values
    bn.keep(1, torch.tensor([9.0, 8.0, 7.0, 6.0], dtype=F64))
    assert torch.equal(store.gather([1])[0], torch.tensor([8.0, 7.0], dtype=F64))
    assert torch.equal(bn.start(1, glob), torch.tensor([1.0, 8.0, 7.0, 4.0], dtype=F64))
    assert torch.equal(bn.start(2, glob), glob)
    for bad in (float("nan"), float("inf")):  # diverged training: the client keeps its own
        bn.keep(1, torch.tensor([0.0, bad, 1.0, 0.0], dtype=F64))
        bn.keep(2, torch.tensor([0.0, 1.0, bad, 0.0], dtype=F64))
    assert torch.equal(store.gather([1])[0], torch.tensor([8.0, 7.0], dtype=F64))
    assert not store.has(2)


def test_a_diverged_round_leaves_every_client_able_to_train(make_data: MakeData) -> None:
    """Round 0 at lr 1000 diverges everywhere (every update refused); round 1 at lr
    0.1 must train as FedAvg does, not start from a NaN batch norm forever."""
    data = make_data([60] * 4, dtype=torch.float32)
    cfg = _cfg(num_clients=4, client_fraction=1.0, rounds=2, dtype="float32")
    cfg = override(cfg, {"batch_size": 10, "lr": 1000.0, "lr_decay": 1e-4})
    res = run(cfg, data, store=False)
    assert sorted(c for r, c, _ in res.rejected if r == 0) == [0, 1, 2, 3]
    assert not [c for r, c, _ in res.rejected if r == 1]
    assert torch.isfinite(torch.tensor(res.rounds[1].train_loss))


def test_the_finished_run_saves_each_clients_batch_norm(
    data: FederatedData, tmp_path: Path
) -> None:
    """The final parameters hold each client's own entries: rebuilt with
    ``client_params``, a client's model is the one its last round trained."""
    from fedforge.algorithms.fedbn import client_params
    from fedforge.store.final import load_final

    exp = build(_cfg(rounds=3, runs_dir=str(tmp_path)), data)
    res = run(exp.cfg, data)
    assert res.run_dir is not None
    final = load_final(res.run_dir)
    personal = final["personal"]
    seen = personal["client_ids"].tolist()
    assert seen == sorted(seen) and 0 < len(seen) <= 5
    mask = local_mask(exp.spec)
    assert torch.equal(personal["mask"], mask)
    # replay independently: every round's state through the same loop, in memory
    replay = build(exp.cfg, data)
    state = LoopState.fresh(replay)
    for r in range(3):
        run_round(replay, state, r, Progress(1, "t", enabled=False))
    store = replay.algorithm.personal.store  # type: ignore[union-attr]
    assert store.written() == seen
    for k in range(5):
        want = state.params.clone()
        if store.has(k):
            want[mask] = store.gather([k])[0]
        assert torch.equal(client_params(final, k), want)
    assert torch.equal(final["params"], res.params)
    assert torch.equal(client_params(res.run_dir, 0), client_params(final, 0))


def test_local_training_updates_running_statistics_in_the_vector(data: FederatedData) -> None:
    model = build_model("cnn_bn", 0, F64)
    spec = ParamSpec.of(model, include_buffers=True)
    start = spec.flatten(model, F64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = _cfg()
    exp = build(cfg, data)
    x, y = data.client_data(0)
    task = ClientTask(0, 0, exp.algorithm.plan(0), 0)
    res = local_sgd(
        model, spec, start, x, y, task.plan, exp.algorithm.loss_fn, minibatch_generator(task)
    )
    got = spec.views(res.params)
    # running statistics moved (they are updated by the forward pass, into the vector)
    assert not torch.equal(got["bn1.running_var"], spec.views(start)["bn1.running_var"])
    # and the module's own tensors were never touched
    for k, v in model.state_dict().items():
        if k.endswith("num_batches_tracked"):
            continue
        assert torch.equal(v, before[k]), k


def test_fedbn_never_changes_batchnorm_through_aggregation(data: FederatedData) -> None:
    cfg = _cfg(server_optimizer={"kind": "adam", "lr": 0.01})
    exp = build(cfg, data)
    personal = exp.algorithm.personal
    assert personal is not None
    mask = personal.mask
    state = LoopState.fresh(exp)
    table = state.client_state["batchnorm"]
    bar = Progress(cfg.rounds, "t", enabled=False)
    initial = exp.initial_params.clone()
    seen: set[int] = set()
    for r in range(cfg.rounds):
        before = {c: table.gather([c])[0].clone() for c in table.written()}
        glob = state.params.clone()
        # what each cohort client's local training gives, computed apart from the round
        expected: dict[int, torch.Tensor] = {}
        _, clients = run_round(exp, state, r, bar)
        for c in [cr.client_id for cr in clients]:
            task = ClientTask(c, r, exp.algorithm.plan(r), cfg.seed)
            own = glob.clone()
            if c in before:
                own[mask] = before[c]
            x, y = data.client_data(c)
            res = local_sgd(
                exp.model,
                exp.spec,
                own,
                x,
                y,
                task.plan,
                exp.algorithm.loss_fn,
                minibatch_generator(task),
            )
            expected[c] = res.params[mask]
        # the global batch-norm entries never move (even under server Adam)
        assert torch.equal(state.params[mask], initial[mask])
        assert not torch.equal(state.params[~mask], glob[~mask])
        for c in table.written():
            if c in expected:  # trained this round: exactly its own local result
                assert torch.equal(table.gather([c])[0], expected[c])
            else:  # not in the cohort: untouched by aggregation
                assert torch.equal(table.gather([c])[0], before[c])
        seen |= set(expected)
    assert len(seen) >= 4  # clients were seen, and some more than once


def test_fedbn_update_carries_no_batchnorm_entry(data: FederatedData) -> None:
    """The wire holds the shared entries alone; the server reads the batch-norm
    ones as zeros."""
    exp = build(_cfg(), data)
    runtime = exp.engine.runtime  # type: ignore[attr-defined]
    payload = encode_payload(exp.initial_params, 0)
    out = wire.decode(runtime.run(ClientTask(2, 0, exp.algorithm.plan(0), 0), payload))
    (delta,) = out.tensors.values()
    mask = exp.algorithm.personal.mask  # type: ignore[union-attr]
    assert delta.numel() == int((~mask).sum())
    read = exp.pipeline.codec.decode(out.tensors, out.meta, exp.spec.size, delta.dtype)
    assert torch.count_nonzero(read[mask]) == 0
    assert torch.equal(read[~mask], delta)
    assert torch.count_nonzero(delta) > 0


def test_fedbn_falls_back_to_serial_and_refuses_models_without_bn(data: FederatedData) -> None:
    exp = build(_cfg(engine="vectorized"), data)
    assert exp.engine.name == "serial"
    assert exp.note is not None and "batch-norm running statistics" in exp.note
    with pytest.raises(ConfigError, match="batch norm"):
        build(_cfg(model="logreg"), data)


def test_fedavg_averages_batchnorm_of_cnn_bn(data: FederatedData) -> None:
    cfg = _cfg(algorithm="fedavg", rounds=1)
    exp = build(cfg, data)
    got = run(cfg, data=data, store=False)
    stats = exp.spec.mask(("buffer",))
    assert not torch.equal(got.params[stats], exp.initial_params[stats])


def test_resume_with_fedbn_is_bit_exact(
    data: FederatedData, tmp_path: Path, run_stopped: RunStopped
) -> None:
    cfg = _cfg(rounds=6, checkpoint_every=2, runs_dir=str(tmp_path / "a"))
    reference = run(cfg, data=data)
    stopped = run_stopped(override(cfg, {"runs_dir": str(tmp_path / "b")}), data, 3)
    assert stopped.stopped == "SIGTERM" and stopped.run_dir is not None
    newest = list_checkpoints(stopped.run_dir)[0]
    assert any(newest.glob("client_state.batchnorm.r*.bin"))
    resumed = resume(stopped.run_dir, data=data)
    assert resumed.stopped is None and len(resumed.rounds) == 6
    assert torch.equal(resumed.params, reference.params)
    with RunStore.open(stopped.run_dir) as got, RunStore.open(reference.run_dir) as want:
        assert [r.test_loss for r in got.rounds()] == [r.test_loss for r in want.rounds()]


def _plain_eval(model: torch.nn.Module, spec: ParamSpec, vec: torch.Tensor, x: Any, y: Any) -> Any:
    """Accuracy and mean loss of an ordinary module loaded with ``vec`` (eval mode)."""
    missing, unexpected = model.load_state_dict(spec.views(vec), strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    acc = (logits.argmax(dim=1) == y).double().mean().item()
    return acc, torch.nn.functional.cross_entropy(logits, y).item()


def test_client_eval_scores_each_client_with_its_own_batch_norm(make_data: MakeData) -> None:
    """By hand: with one client a round, after round 0 the trained client holds
    exactly FedAvg's new global model (the mean of one update), while FedBN's global
    vector is that model with the initial batch norm (what an unseen client gets).
    A plain module loaded with each, in eval mode, must give FedBN's per-client rows."""
    data = make_data([24, 24], num_test=8, dtype=F64)
    extra = {
        "num_clients": 2,
        "client_fraction": 0.5,
        "evaluation": {"clients": True, "holdout": 0.5},
    }
    rows, params, exps = {}, {}, {}
    for alg in ("fedbn", "fedavg"):
        exp = build(_cfg(algorithm=alg, **extra), data)
        state = LoopState.fresh(exp)
        run_round(exp, state, 0, Progress(1, "t", enabled=False))
        rows[alg] = {c: (acc, loss) for _, c, acc, loss, _ in state.outputs["client_eval"]}
        params[alg], exps[alg] = state.params, exp
    exp = exps["fedbn"]
    store = exp.algorithm.personal.store  # type: ignore[union-attr]
    (trained,) = [c for c in (0, 1) if store.has(c)]
    unseen = 1 - trained
    model = build_model("cnn_bn", 0, F64)
    x, y = exp.data.holdout_data(trained)
    want = _plain_eval(model, exp.spec, params["fedavg"], x, y)
    assert rows["fedbn"][trained][0] == want[0]
    assert rows["fedbn"][trained][1] == pytest.approx(want[1], abs=1e-9)
    global_bn = _plain_eval(model, exp.spec, params["fedbn"], x, y)
    assert abs(global_bn[1] - want[1]) > 1e-3  # the global batch norm would score otherwise
    x, y = exp.data.holdout_data(unseen)
    want = _plain_eval(model, exp.spec, params["fedbn"], x, y)
    assert rows["fedbn"][unseen][0] == want[0]
    assert rows["fedbn"][unseen][1] == pytest.approx(want[1], abs=1e-9)


def test_fedbn_against_a_plain_module_with_each_clients_batch_norm(
    make_data: MakeData, one_thread: None
) -> None:
    """FedBN (Li et al. 2021) written out on a plain ``nn.Module`` with
    ``torch.optim.SGD`` and a ``state_dict`` of batch-norm entries per client (no
    fedforge training code): every sampled client trains from the global shared
    layers and its own batch norm (the initial one the first time), the server
    averages the shared layers by examples, each client keeps its batch norm.
    Four rounds at C = 0.6, float64: shared layers and every client's batch norm."""
    import copy

    from torch import nn

    from fedforge.core.rng import torch_generator
    from fedforge.selection.sampling import sample_cohort

    data = make_data([20, 12, 17, 9, 14], seed=2)
    cfg = from_dict(
        {**BASE, "model": "cnn_bn", "algorithm": "fedbn", "num_clients": 5,
         "client_fraction": 0.6, "local_epochs": 1, "batch_size": 8, "lr": 0.05, "rounds": 4}
    )  # fmt: skip
    exp = build(cfg, data)
    state = LoopState.fresh(exp)
    for r in range(cfg.rounds):
        run_round(exp, state, r, Progress(cfg.rounds, "t", enabled=False))

    model = build_model("cnn_bn", 0, F64)
    spec = ParamSpec.of(model, include_buffers=True)
    spec.load_into(model, exp.initial_params)
    shared = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("bn")}
    initial_bn = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("bn")}
    own_bn: dict[int, dict[str, torch.Tensor]] = {}
    for r in range(cfg.rounds):
        deltas, sizes = [], []
        for k in sample_cohort(5, 0.6, cfg.seed, r):
            model.load_state_dict({**shared, **copy.deepcopy(own_bn.get(k, initial_bn))})
            model.train()
            idx = list(data.partition.client_indices[k])
            xs, ys = data.train_x[idx], data.train_y[idx]
            opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
            order = torch.randperm(len(ys), generator=torch_generator(cfg.seed, "minibatch", r, k))
            for b in order.split(8):
                opt.zero_grad()
                nn.functional.cross_entropy(model(xs[b]), ys[b]).backward()
                opt.step()
            after = model.state_dict()
            own_bn[k] = {n: v.clone() for n, v in after.items() if n.startswith("bn")}
            deltas.append({n: after[n] - shared[n] for n in shared})
            sizes.append(len(ys))
        total = sum(sizes)
        shared = {
            n: shared[n] + sum(s * d[n] for s, d in zip(sizes, deltas, strict=True)) / total
            for n in shared
        }
    ours = spec.views(state.params)
    for n, v in shared.items():
        if n in ours:  # parameters and buffers the flat vector holds
            torch.testing.assert_close(ours[n], v, rtol=0, atol=1e-12)
    personal = exp.algorithm.personal
    assert personal is not None and sorted(own_bn) == personal.store.written()
    for k, entries in own_bn.items():
        row = torch.zeros(spec.size, dtype=F64)
        row[personal.mask] = personal.store.gather([k])[0]
        mine = spec.views(row)
        for n, v in entries.items():
            if n in mine:
                torch.testing.assert_close(mine[n], v, rtol=0, atol=1e-12)

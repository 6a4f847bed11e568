"""Issue 4 part A: FedProx, SCAFFOLD, stragglers and the local knobs, against
hand-worked tiny cases, torch.optim.SGD, FedAvg and the serial engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData
from torch import nn

from conftest import RunStopped
from fedforge.algorithms import LocalPlan, fedprox, scaffold
from fedforge.algorithms.fedprox import ProximalTerm
from fedforge.algorithms.scaffold import ScaffoldClient, ScaffoldServer
from fedforge.client.runtime import ClientRuntime, ClientTask, encode_payload, local_sgd
from fedforge.config import from_dict, override
from fedforge.core import wire
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.core.rng import torch_generator
from fedforge.data.federated import FederatedData
from fedforge.models.mnist import MnistCNN
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run
from fedforge.server.stragglers import cohort_tasks, straggler_epochs
from fedforge.store import MemoryStateStore, RunStore, list_checkpoints

F64 = torch.float64
BASE: dict[str, Any] = {
    "model": "logreg",
    "num_clients": 6,
    "client_fraction": 0.5,
    "local_epochs": 3,
    "batch_size": 8,
    "lr": 0.05,
    "rounds": 3,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data([30, 12, 41, 25, 7, 33], dtype=F64)


def _cfg(**extra: Any) -> Any:
    return from_dict({**BASE, **extra})


def _squared(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((pred - target) ** 2).sum(dim=1)


def test_fedprox_step_adds_mu_times_drift() -> None:
    # x = (1, 2), y = 3, squared error, w_t = 0, lr 0.1, mu 0.5, full batch, 2 steps.
    # Step 1 (w = w_t, no drift): grad (-6, -12, -6) -> w = (0.6, 1.2, 0.6).
    # Step 2: loss grad (1.2, 2.4, 1.2) + 0.5 (0.6, 1.2, 0.6) = (1.5, 3.0, 1.5)
    #         -> w = (0.6, 1.2, 0.6) - 0.1 (1.5, 3.0, 1.5) = (0.45, 0.9, 0.45).
    model = nn.Linear(2, 1).to(F64)
    spec = ParamSpec.of(model)
    x = torch.tensor([[1.0, 2.0]], dtype=F64)
    y = torch.tensor([[3.0]], dtype=F64)
    plan = LocalPlan(2, None, 0.1)
    start = torch.zeros(3, dtype=F64)
    out = local_sgd(model, spec, start, x, y, plan, _squared, torch.Generator(), ProximalTerm(0.5))
    torch.testing.assert_close(out.params, torch.tensor([0.45, 0.9, 0.45], dtype=F64))


@pytest.mark.parametrize("engine", ["serial", "vectorized"])
def test_fedprox_mu0_is_fedavg_bit_for_bit(data: FederatedData, engine: str) -> None:
    avg = run(_cfg(engine=engine), data=data, store=False)
    prox = run(
        _cfg(engine=engine, algorithm="fedprox", fedprox={"mu": 0.0}), data=data, store=False
    )
    assert torch.equal(avg.params, prox.params)
    assert prox.summary["engine"] == engine
    moved = run(
        _cfg(engine=engine, algorithm="fedprox", fedprox={"mu": 0.5}), data=data, store=False
    )
    assert not torch.equal(avg.params, moved.params)


@pytest.mark.parametrize("engine", ["serial", "vectorized"])
def test_scaffold_first_round_is_fedavg(data: FederatedData, engine: str) -> None:
    avg = run(_cfg(rounds=1, engine=engine), data=data, store=False)
    sca = run(_cfg(rounds=1, algorithm="scaffold", engine=engine), data=data, store=False)
    # c = c_k = 0: no correction. On one engine path bit for bit; the vectorised
    # engine runs FedAvg's 2NN through its fused matmul path and SCAFFOLD through
    # vmap, which round differently: float64 agreement instead.
    if engine == "serial":
        assert torch.equal(avg.params, sca.params)
    else:
        torch.testing.assert_close(avg.params, sca.params, rtol=0, atol=1e-12)
    # the controls travel: c in the payload, delta c_k in every update
    assert sca.rounds[0].bytes_down > avg.rounds[0].bytes_down
    assert sca.rounds[0].bytes_up > avg.rounds[0].bytes_up


@pytest.mark.parametrize(("option", "new_ck"), [("I", -4.0), ("II", -3.625)])
def test_scaffold_control_update_by_hand(option: str, new_ck: float) -> None:
    # w = 0 (no bias), x = 1, y = 2, loss (w - 2)^2, grad 2 (w - 2); c = 0.5, c_k = 0.25,
    # lr 0.1, two full-batch steps with g - c_k + c = g + 0.25:
    #   step 1: g = -4,    w = 0 - 0.1 (-3.75) = 0.375
    #   step 2: g = -3.25, w = 0.375 - 0.1 (-3.0) = 0.675
    # option I:  c_k+ = grad at w = 0 = -4
    # option II: c_k+ = c_k - c + (0 - 0.675) / (2 * 0.1) = -0.25 - 3.375 = -3.625
    model = nn.Linear(1, 1, bias=False).to(F64)
    spec = ParamSpec.of(model)
    store = MemoryStateStore(3, 1, F64)
    store.scatter([1], torch.tensor([[0.25]], dtype=F64))
    alg = scaffold(LocalPlan(2, None, 0.1), store, option)  # type: ignore[arg-type]
    alg = dataclasses.replace(alg, loss_fn=_squared)
    x, y = torch.ones(1, 1, dtype=F64), torch.full((1, 1), 2.0, dtype=F64)
    runtime = ClientRuntime(model, spec, alg, lambda c: (x, y))
    c = torch.tensor([0.5], dtype=F64)
    payload = encode_payload(torch.zeros(1, dtype=F64), 0, extras={"control": c})
    msg = wire.decode(runtime.run(ClientTask(1, 0, alg.plan(0), 0), payload))
    torch.testing.assert_close(msg.tensors["delta"], torch.tensor([0.675], dtype=F64))
    assert alg.client is not None
    alg.client.commit({1})  # the server used the update: c_k+ is stored
    torch.testing.assert_close(store.gather([1])[0], torch.tensor([new_ck], dtype=F64))
    delta_ck = msg.tensors["alg/control_delta"]
    torch.testing.assert_close(delta_ck, torch.tensor([new_ck - 0.25], dtype=F64))
    # server: c += (|S| / N) mean(delta c_k) = sum(delta c_k) / N, here N = 4
    state = {"control": torch.tensor([0.5], dtype=F64)}
    other = {"control_delta": torch.tensor([1.0], dtype=F64)}
    moved = ScaffoldServer().moved(state, [{"control_delta": delta_ck}, other], num_clients=4)
    want = torch.tensor([0.5 + (new_ck - 0.25 + 1.0) / 4], dtype=F64)
    torch.testing.assert_close(moved["control"], want)
    assert state["control"].item() == 0.5  # a new state: the round keeps it if it stands


CASES: dict[str, dict[str, Any]] = {
    "fedprox_stragglers_momentum": {
        "algorithm": "fedprox",
        "fedprox": {"mu": 0.3},
        "stragglers": {"fraction": 0.67},
        "local": {"momentum": 0.9, "weight_decay": 0.01},
    },
    "scaffold_II_clip": {"algorithm": "scaffold", "local": {"grad_clip": 0.5}},
    "scaffold_I": {"algorithm": "scaffold", "scaffold": {"option": "I"}},
    "fedavg_knobs_stragglers": {
        "stragglers": {"fraction": 0.34},
        "local": {"momentum": 0.5, "weight_decay": 0.1, "grad_clip": 1.0},
        "lr_decay": 0.9,
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_vectorized_equals_serial(data: FederatedData, case: str) -> None:
    cfg = _cfg(**CASES[case])
    serial = run(override(cfg, {"engine": "serial"}), data=data, store=False)
    vector = run(override(cfg, {"engine": "vectorized"}), data=data, store=False)
    assert vector.summary["engine"] == "vectorized"
    diff = (serial.params - vector.params).abs().max().item()
    assert diff < 1e-9, diff
    for a, b in zip(serial.rounds, vector.rounds, strict=True):
        assert a.train_loss == pytest.approx(b.train_loss, abs=1e-12)


def test_2nn_vectorized_equals_serial_with_stragglers_and_scaffold(data: FederatedData) -> None:
    strag = {"fraction": 0.67, "drop": False}  # SCAFFOLD keeping partial work
    cfg = _cfg(model="2nn", algorithm="scaffold", rounds=2, stragglers=strag)
    serial = run(override(cfg, {"engine": "serial"}), data=data, store=False)
    vector = run(override(cfg, {"engine": "vectorized"}), data=data, store=False)
    assert (serial.params - vector.params).abs().max().item() < 1e-9


def test_momentum_weight_decay_clip_match_torch_sgd() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(23, 4, dtype=F64, generator=gen)
    y = torch.randn(23, 2, dtype=F64, generator=gen)
    model = nn.Linear(4, 2).to(F64)
    spec = ParamSpec.of(model)
    start = spec.flatten(model, F64)
    plan = LocalPlan(3, 5, 0.05, momentum=0.9, weight_decay=0.01, grad_clip=0.7)
    ours = local_sgd(model, spec, start, x, y, plan, _squared, torch_generator(3, "mb"))
    ref = nn.Linear(4, 2).to(F64)
    spec.load_into(ref, start)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    order = torch_generator(3, "mb")
    clipped = 0
    for _ in range(3):
        for idx in torch.randperm(23, generator=order).split(5):
            opt.zero_grad()
            _squared(ref(x[idx]), y[idx]).mean().backward()
            norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.7)
            clipped += int(norm > 0.7)
            opt.step()
    assert clipped > 0  # the clip really acted
    torch.testing.assert_close(ours.params, spec.flatten(ref, F64), rtol=0, atol=1e-12)


def test_stragglers_are_deterministic_and_fedavg_drops_fedprox_keeps() -> None:
    cohort = [3, 7, 11, 12, 20, 31, 40, 44, 50, 60]
    a = straggler_epochs(cohort, 0.5, 20, seed=5, round_idx=2)
    assert a == straggler_epochs(cohort, 0.5, 20, seed=5, round_idx=2)
    assert len(a) == 5 and set(a) <= set(cohort)
    assert all(1 <= e <= 19 for e in a.values())
    assert a != straggler_epochs(cohort, 0.5, 20, seed=5, round_idx=3)
    assert straggler_epochs(cohort, 0.0, 20, 5, 2) == {}
    # the official code: round(K (1 - f)) active. K = 3, f = 0.5: 2 active, 1 slow;
    # K = 5: round(2.5) = 2 active (half to even), 3 slow; f = 0.9 of 10: 9 slow
    assert [len(straggler_epochs(cohort[:k], f, 20, 5, 2)) for k, f in
            ((3, 0.5), (5, 0.5), (10, 0.9), (10, 0.5))] == [1, 3, 9, 5]  # fmt: skip
    cfg = from_dict({**BASE, "seed": 5, "local_epochs": 20, "stragglers": {"fraction": 0.5}})
    plan = LocalPlan(20, 8, 0.1)
    avg = cohort_tasks(cfg, fedprox(plan, 0.0, drop_stragglers=True), cohort, 2, plan)
    prox = cohort_tasks(cfg, fedprox(plan, 0.0), cohort, 2, plan)
    assert [t.client_id for t in avg] == [c for c in cohort if c not in a]
    assert [t.client_id for t in prox] == cohort
    assert {t.client_id: t.plan.local_epochs for t in prox if t.client_id in a} == a


def test_fedavg_run_drops_stragglers_fedprox_aggregates_them(data: FederatedData) -> None:
    strag = {"stragglers": {"fraction": 0.67}}
    avg = run(_cfg(**strag), data=data, store=False)
    prox = run(_cfg(algorithm="fedprox", fedprox={"mu": 0.0}, **strag), data=data, store=False)
    assert [r.cohort_size for r in avg.rounds] == [3, 3, 3]
    assert torch.isfinite(avg.params).all()
    # 2 of 3 straggle: FedAvg uploads one update a round, FedProx three
    assert prox.rounds[0].bytes_up == pytest.approx(3 * avg.rounds[0].bytes_up, rel=0.01)


def test_config_refusals() -> None:
    with pytest.raises(ConfigError, match="stragglers.fraction"):
        from_dict({"local_epochs": 1, "stragglers": {"fraction": 0.5}})
    with pytest.raises(ConfigError, match="'fedprox.mu'"):
        from_dict({"algorithm": "fedprox", "fedprox": {"mu": -1}})
    with pytest.raises(ConfigError, match="logreg"):
        from_dict({"dataset": "synthetic", "model": "cnn"})
    with pytest.raises(ConfigError, match="local.momentum"):
        from_dict({"local": {"momentum": 1.0}})
    with pytest.raises(ConfigError, match="scaffold.option"):
        from_dict({"scaffold": {"option": "III"}})


def test_resume_with_scaffold_is_bit_exact(
    data: FederatedData, tmp_path: Path, run_stopped: RunStopped
) -> None:
    cfg = _cfg(algorithm="scaffold", rounds=6, checkpoint_every=2, runs_dir=str(tmp_path / "a"))
    reference = run(cfg, data=data)
    stopped = run_stopped(override(cfg, {"runs_dir": str(tmp_path / "b")}), data, 3)
    assert stopped.stopped == "SIGTERM" and stopped.run_dir is not None
    newest = list_checkpoints(stopped.run_dir)[0]
    assert newest.name == "round-000004"
    assert any(newest.glob("client_state.control.r*.bin"))
    resumed = resume(stopped.run_dir, data=data)
    assert resumed.stopped is None and len(resumed.rounds) == 6
    assert torch.equal(resumed.params, reference.params)
    with RunStore.open(stopped.run_dir) as got, RunStore.open(reference.run_dir) as want:
        assert [r.test_loss for r in got.rounds()] == [r.test_loss for r in want.rounds()]


def test_scaffold_client_keeps_its_control_when_local_training_blows_up() -> None:
    """Option II from a non-finite local result would store a non-finite c_k and
    poison every later round of that client: the client keeps its old c_k
    (its non-finite update is refused by the server anyway)."""
    from fedforge.algorithms.local import ClientJob
    from fedforge.algorithms.scaffold import CONTROL, CONTROL_DELTA, ScaffoldClient
    from fedforge.client.runtime import LocalResult
    from fedforge.store.client_state import MemoryStateStore

    store = MemoryStateStore(2, 3, F64)
    store.scatter([1], torch.tensor([[0.5, -0.5, 0.25]], dtype=F64))
    client = ScaffoldClient(store, "II")
    start = torch.zeros(3, dtype=F64)
    extras = {CONTROL: torch.zeros(3, dtype=F64)}

    def job(params: torch.Tensor) -> ClientJob:
        result = LocalResult(params, float("nan"), 2)
        return ClientJob(1, start, result, start, start, 0.1, extras, lambda p, x, y: p)

    sent = client.end(job(torch.tensor([float("nan"), 1.0, float("inf")], dtype=F64)))
    assert not torch.isfinite(sent[CONTROL_DELTA]).all()  # travels, and is refused
    assert torch.equal(store.gather([1])[0], torch.tensor([0.5, -0.5, 0.25], dtype=F64))
    client.commit({1})  # even when the server used the update
    assert torch.equal(store.gather([1])[0], torch.tensor([0.5, -0.5, 0.25], dtype=F64))
    # a finite run moves it as before: c_k+ = c_k - c + (w_t - w) / (K lr), once
    # the server has used the update
    client.end(job(torch.tensor([0.2, 0.0, -0.2], dtype=F64)))
    client.commit({0})  # not this client's: it keeps its c_k
    assert torch.equal(store.gather([1])[0], torch.tensor([0.5, -0.5, 0.25], dtype=F64))
    client.end(job(torch.tensor([0.2, 0.0, -0.2], dtype=F64)))
    client.commit({1})
    want = torch.tensor([0.5 - 1.0, -0.5, 0.25 + 1.0], dtype=F64)
    torch.testing.assert_close(store.gather([1])[0], want)


@pytest.mark.parametrize(
    "robust",
    [
        # a scaled attacker refused by the norm gate in rounds that go on
        {"norm_gate": 3.0, "attack": "scaled", "attack_fraction": 0.25, "attack_scale": 50.0},
        # rounds skipped for too few clients, some of them aggregated
        {"min_clients": 3, "max_skipped_rounds": 0, "client_gate": True},
    ],
)
def test_scaffold_server_control_stays_the_mean_of_the_client_controls(
    make_data: MakeData, one_thread: None, robust: dict[str, Any]
) -> None:
    """Karimireddy et al. 2020, Algorithm 1: c starts at the mean of the c_k (all
    zero) and moves by (1/N) sum delta c_k over the clients whose c_k moved, so
    c = (1/N) sum_k c_k after every round. A client whose update the server
    refused (or whose round it skipped) kept its new c_k while c never saw it:
    off by 0.06-0.07 here before the fix."""
    from fedforge.report.progress import Progress
    from fedforge.server.round import run_round
    from fedforge.server.state import LoopState

    data = make_data([30, 12, 41, 25, 7, 33, 18, 22], seed=1, dtype=F64)
    cfg = _cfg(
        model="logreg",
        num_clients=8,
        client_fraction=0.5,
        rounds=8,
        algorithm="scaffold",
        robust=robust,
    )
    exp = build(cfg, data)
    state = LoopState.fresh(exp)
    store = exp.algorithm.client.store
    moved = 0
    for r in range(cfg.rounds):
        before = store.gather(list(range(8))).clone()
        record, clients = run_round(exp, state, r, Progress(cfg.rounds, "t", enabled=False))
        after = store.gather(list(range(8)))
        changed = {k for k in range(8) if not torch.equal(before[k], after[k])}
        assert changed <= {c.client_id for c in clients}  # only clients the server used
        moved += len(changed)
        mean = after.sum(dim=0) / 8
        torch.testing.assert_close(state.algorithm_state["control"], mean, rtol=0, atol=1e-15)
    assert moved > 0  # rounds that moved controls, and rounds that refused or skipped:
    assert state.rejected if "norm_gate" in robust else state.skipped


def _scaffold_by_hand(
    data: FederatedData, start: torch.Tensor, rounds: int, lr: float, batch: int, seed: int
) -> torch.Tensor:
    """SCAFFOLD, option II, every client every round, written out on a plain
    ``nn.Module`` (no fedforge training code): a second implementation."""
    model = MnistCNN().to(F64)
    spec = ParamSpec.of(model)
    x = start.clone()
    n = data.partition.num_clients
    c = torch.zeros_like(x)
    ck = [torch.zeros_like(x) for _ in range(n)]
    for r in range(rounds):
        deltas, dcs = [], []
        for k, idx_k in enumerate(data.partition.client_indices):
            spec.load_into(model, x)
            xs, ys = data.train_x[list(idx_k)], data.train_y[list(idx_k)]
            order = torch.randperm(len(ys), generator=torch_generator(seed, "minibatch", r, k))
            batches = order.split(batch)
            corr = spec.views(c - ck[k])  # fixed over the local run: g - c_k + c
            for idx in batches:
                loss = nn.functional.cross_entropy(model(xs[idx]), ys[idx])
                grads = torch.autograd.grad(loss, list(model.parameters()))
                with torch.no_grad():
                    for (name, p), g in zip(model.named_parameters(), grads, strict=True):
                        p -= lr * (g + corr[name])
            y = spec.flatten(model, F64)
            new = ck[k] - c + (x - y) / (len(batches) * lr)
            deltas.append(y - x)
            dcs.append(new - ck[k])
            ck[k] = new
        x = x + torch.stack(deltas).mean(dim=0)  # equal client sizes: n_k weights uniform
        c = c + torch.stack(dcs).sum(dim=0) / n
    return x


@pytest.mark.parametrize("engine", ["serial", "vectorized"])
def test_scaffold_cnn_matches_a_hand_written_scaffold(
    make_data: MakeData, one_thread: None, engine: str
) -> None:
    data = make_data([8, 8, 8], seed=3)
    cfg = _cfg(
        model="cnn",
        num_clients=3,
        client_fraction=1.0,
        local_epochs=1,
        batch_size=4,
        lr=0.05,
        rounds=3,
        algorithm="scaffold",
        engine=engine,
    )
    ours = run(cfg, data=data, store=False)
    assert ours.summary["engine"] == engine
    start = build(cfg, data).initial_params
    ref = _scaffold_by_hand(data, start, 3, 0.05, 4, cfg.seed)
    assert (ref - start).abs().max().item() > 1e-3  # it trained
    torch.testing.assert_close(ours.params, ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize("groups", [0, 2])
def test_scaffold_control_deltas_whose_sum_overflows_skip_the_round(
    make_data: MakeData, one_thread: None, monkeypatch: pytest.MonkeyPatch, groups: int
) -> None:
    """Clients 0 and 1 (one edge under groups = 2) each send a finite delta c_k of
    1e308: their sum is inf. Flat, c became inf and every later round was
    skipped for good; with edges, the edge's refused sum ended the run. Now the
    round is skipped like an overflowing aggregate: c and every c_k stay. (The
    default norm bound refuses such a delta c_k by itself: off here, to reach the sum.)"""
    import importlib

    from tests.conftest import TINY_LOGREG

    from fedforge.report.progress import Progress
    from fedforge.server.round import run_round
    from fedforge.server.state import LoopState

    scaffold_module = importlib.import_module("fedforge.algorithms.scaffold")
    end = scaffold_module.ScaffoldClient.end
    hostile_once: set[int] = set()

    def hostile(self: Any, job: Any) -> dict[str, torch.Tensor]:
        out = end(self, job)
        if job.client_id in (0, 1) and job.client_id not in hostile_once:  # the first round
            hostile_once.add(job.client_id)
            out = {k: torch.full_like(v, 1e308) for k, v in out.items()}
        return out

    monkeypatch.setattr(scaffold_module.ScaffoldClient, "end", hostile)
    cfg = from_dict(
        {
            **TINY_LOGREG,
            "rounds": 2,
            "algorithm": "scaffold",
            "communication": {"groups": groups},
            "robust": {"max_update_ratio": None},
        }
    )
    exp = build(cfg, make_data([30, 30, 30, 30], seed=1))
    state = LoopState.fresh(exp)
    store = exp.algorithm.client.store
    run_round(exp, state, 0, Progress(2, "t", enabled=False))
    assert [r for r, _ in state.skipped] == [0]
    want = "edge 0: 'control_delta' holds non-finite" if groups else "control overflowed"
    assert want in state.skipped[0][1]
    assert torch.equal(state.algorithm_state["control"], torch.zeros_like(exp.initial_params))
    assert store.written() == []
    run_round(exp, state, 1, Progress(2, "t", enabled=False))  # the next round stands
    assert [r for r, _ in state.skipped] == [0]
    assert bool(torch.isfinite(state.algorithm_state["control"]).all())
    assert store.written() == [0, 1, 2, 3]


def test_the_server_moves_c_by_what_the_edges_forwarded(
    make_data: MakeData, one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under groups the server's c moves by the edges' forwarded sums, not by the
    clients' own tensors (which never left the edges): zero the forwarded sums
    and c stays zero."""
    from tests.conftest import TINY_LOGREG

    from fedforge.server.collectors.hierarchical import Edges

    forward = Edges.forward

    def zeroed(self: Edges, *args: Any) -> int:
        sent = forward(self, *args)
        self.received = [{k: torch.zeros_like(v) for k, v in e.items()} for e in self.received]
        return sent

    cfg = {**TINY_LOGREG, "rounds": 2, "algorithm": "scaffold", "communication": {"groups": 2}}
    data = make_data([30, 30, 30, 30], seed=1)
    exp = build(from_dict(cfg), data)
    from fedforge.report.progress import Progress
    from fedforge.server.round import run_round
    from fedforge.server.state import LoopState

    state = LoopState.fresh(exp)
    run_round(exp, state, 0, Progress(1, "t", enabled=False))
    assert float(state.algorithm_state["control"].abs().max()) > 0
    monkeypatch.setattr(Edges, "forward", zeroed)
    exp = build(from_dict(cfg), data)
    state = LoopState.fresh(exp)
    run_round(exp, state, 0, Progress(1, "t", enabled=False))
    assert float(state.algorithm_state["control"].abs().max()) == 0


def test_scaffold_commit_used_keeps_the_others_pending() -> None:
    # a deployment's client hears of each round's use apart: the used client's
    # c_k+ is stored, the other's stays pending (read back, and committed later)
    store = MemoryStateStore(3, 2, F64)
    client = ScaffoldClient(store, "II")
    new = {1: torch.tensor([1.0, 2.0], dtype=F64), 2: torch.tensor([-3.0, 4.0], dtype=F64)}
    client.restore_pending(new)
    client.commit_used({1})
    assert torch.equal(store.gather([1])[0], new[1])
    assert not store.has(2)
    assert set(client.pending()) == {2} and torch.equal(client.pending()[2], new[2])
    client.commit_used({2})
    assert torch.equal(store.gather([2])[0], new[2]) and client.pending() == {}

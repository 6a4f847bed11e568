"""Issue 4 item 4: Per-FedAvg (FO; HF with the exact or the finite-difference
Hessian-vector product), personalised evaluation and FedAvg + fine-tuning,
against hand formulas on closed-form losses, the Hessian from
torch.autograd.functional.hessian, plain SGD and FedAvg."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData
from torch import nn

from fedforge.algorithms.base import LocalPlan, cross_entropy
from fedforge.algorithms.perfedavg import Gradients, MetaSteps
from fedforge.config import from_dict, override
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.core.rng import torch_generator
from fedforge.data.federated import FederatedData
from fedforge.evaluation.clients import client_accuracies
from fedforge.evaluation.personal import personal_accuracies, personal_lr
from fedforge.report.runs import format_run_summary
from fedforge.server.experiment import build
from fedforge.server.loop import run
from fedforge.store import RunStore

F64 = torch.float64
N, B = 12, 4  # the tiny client: 12 examples, batches of 4 (so batches are drawn)


def _logreg_loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of multinomial logistic regression, w = (W [2, 3], b [2])
    flat in nn.Linear's order: the closed form the tests differentiate."""
    logits = x @ w[:6].view(2, 3).T + w[6:]
    return torch.nn.functional.cross_entropy(logits, y)


def _grad(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.func.grad(_logreg_loss)(w, x, y)


def _tiny() -> tuple[nn.Module, ParamSpec, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(N, 3, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (N,), generator=gen)
    model = nn.Linear(3, 2).to(F64)
    start = 0.5 * torch.randn(8, generator=gen, dtype=F64)
    return model, ParamSpec.of(model), start, x, y


def _batches(seed: int) -> Callable[[], torch.Tensor]:
    """Replays the draws of MetaSteps: each batch B of the N indices without replacement."""
    gen = torch.Generator().manual_seed(seed)
    return lambda: torch.randperm(N, generator=gen)[:B]


def _meta(variant: str, alpha: float, steps: int, hvp: str = "exact", seed: int = 7) -> Any:
    model, spec, start, x, y = _tiny()
    loop = MetaSteps(variant, alpha, steps, hvp, 1e-5)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(seed)
    return loop(model, spec, start, x, y, LocalPlan(1, B, 0.3), cross_entropy, gen)


def test_fo_steps_equal_the_hand_formula() -> None:
    alpha, beta = 0.2, 0.3
    _, _, w, x, y = _tiny()
    draw = _batches(7)
    for _ in range(3):  # w' = w - alpha g(w; D); w <- w - beta g(w'; D')
        d, d1 = draw(), draw()
        temp = w - alpha * _grad(w, x[d], y[d])
        w = w - beta * _grad(temp, x[d1], y[d1])
    out = _meta("fo", alpha, 3)
    torch.testing.assert_close(out.params, w, rtol=0, atol=1e-12)
    assert out.steps == 3


def test_hf_exact_steps_equal_the_hand_formula_with_the_explicit_hessian() -> None:
    alpha, beta = 0.2, 0.3
    _, _, w, x, y = _tiny()
    draw = _batches(7)
    eye = torch.eye(8, dtype=F64)
    for _ in range(3):  # w <- w - beta (I - alpha H(w; D'')) g(w'; D')
        d, d1, d2 = draw(), draw(), draw()
        temp = w - alpha * _grad(w, x[d], y[d])
        xs, ys = x[d2], y[d2]
        hess = torch.autograd.functional.hessian(lambda v, xs=xs, ys=ys: _logreg_loss(v, xs, ys), w)
        w = w - beta * (eye - alpha * hess) @ _grad(temp, x[d1], y[d1])
    out = _meta("hf", alpha, 3)
    torch.testing.assert_close(out.params, w, rtol=0, atol=1e-12)
    fo = _meta("fo", alpha, 3)
    assert (out.params - fo.params).abs().max() > 1e-4  # the second-order term matters


def test_finite_difference_hvp_approximates_the_exact_one() -> None:
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).to(F64)
    spec = ParamSpec.of(model)
    w = spec.flatten(model, F64)
    x, y = torch.randn(16, 5, generator=gen, dtype=F64), torch.randint(0, 3, (16,), generator=gen)
    v = torch.randn(spec.size, generator=gen, dtype=F64)
    grads = Gradients(model, spec, cross_entropy)
    exact = grads.hvp(w, x, y, v, "exact")
    errors = []
    for delta in (1e-2, 1e-3):
        approx = grads.hvp(w, x, y, v, "finite_difference", delta)
        errors.append(float((approx - exact).norm() / exact.norm()))
    assert errors[0] < 5e-3 and errors[1] < 5e-5
    assert errors[1] < errors[0] / 50  # the central difference's error is O(delta^2)
    # and the exact product is H v with H from torch.autograd.functional.hessian
    _, _, w8, x8, y8 = _tiny()
    v8 = torch.randn(8, generator=gen, dtype=F64)
    hess = torch.autograd.functional.hessian(lambda u: _logreg_loss(u, x8, y8), w8)
    model8 = nn.Linear(3, 2).to(F64)
    mine = Gradients(model8, ParamSpec.of(model8), cross_entropy).hvp(w8, x8, y8, v8)
    torch.testing.assert_close(mine, hess @ v8, rtol=0, atol=1e-12)


def test_hf_with_finite_differences_is_close_to_hf_exact() -> None:
    exact, approx = _meta("hf", 0.2, 3, "exact"), _meta("hf", 0.2, 3, "finite_difference")
    torch.testing.assert_close(approx.params, exact.params, rtol=0, atol=1e-8)


def test_a_period_of_k_rounds_takes_k_tau_meta_steps() -> None:
    # upload_every = k hands the client a plan of k epochs: k tau meta-steps
    model, spec, start, x, y = _tiny()
    plans = {1: LocalPlan(1, B, 0.3), 2: LocalPlan(2, B, 0.3)}
    outs = {}
    for k, (tau, plan) in {1: (6, plans[1]), 2: (3, plans[2])}.items():
        gen = torch.Generator().manual_seed(7)
        outs[k] = MetaSteps("fo", 0.2, tau)(model, spec, start, x, y, plan, cross_entropy, gen)
    assert outs[1].steps == outs[2].steps == 6
    assert torch.equal(outs[1].params, outs[2].params)


def test_alpha_zero_fo_is_sgd_with_lr_beta_on_the_second_batches() -> None:
    beta = 0.3
    _, _, w, x, y = _tiny()
    draw = _batches(7)
    for _ in range(4):
        draw()  # D: with alpha = 0 the temporary model is w itself
        d1 = draw()
        w = w - beta * _grad(w, x[d1], y[d1])
    torch.testing.assert_close(_meta("fo", 0.0, 4).params, w, rtol=0, atol=1e-12)


BASE: dict[str, Any] = {
    "model": "2nn",
    "num_clients": 6,
    "client_fraction": 0.5,
    "batch_size": 8,
    "lr": 0.05,
    "rounds": 2,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data([30, 12, 41, 25, 7, 33], num_test=20, dtype=F64)


def _cfg(tmp_path: Path | None = None, **extra: Any) -> Any:
    where = {"runs_dir": str(tmp_path)} if tmp_path is not None else {}
    return from_dict({**BASE, **where, **extra})


def test_alpha_zero_full_batch_run_equals_fedavg(data: FederatedData) -> None:
    # One meta-step on the whole data with alpha = 0 is one full-batch SGD step
    # of size beta: FedAvg with E = 1, B = infinity, lr = beta (a second
    # implementation: client.local_sgd), up to the order of summation.
    pfa = {"alpha": 0.0, "beta": 0.05, "steps": 1}
    per = run(_cfg(algorithm="perfedavg", batch_size=None, perfedavg=pfa), data, store=False)
    avg = run(_cfg(batch_size=None, local_epochs=1), data, store=False)
    torch.testing.assert_close(per.params, avg.params, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_runs_are_deterministic_in_the_seed(data: FederatedData, variant: str) -> None:
    pfa = {"variant": variant, "alpha": 0.05, "steps": 3}
    one = run(_cfg(algorithm="perfedavg", perfedavg=pfa), data, store=False)
    two = run(_cfg(algorithm="perfedavg", perfedavg=pfa), data, store=False)
    other = run(_cfg(algorithm="perfedavg", perfedavg=pfa, seed=1), data, store=False)
    assert torch.equal(one.params, two.params)
    assert not torch.equal(one.params, other.params)
    assert [r.train_loss for r in one.rounds] == [r.train_loss for r in two.rounds]


def test_personal_evaluation_after_zero_steps_is_the_global_one(data: FederatedData) -> None:
    exp = build(_cfg(evaluation={"clients": True}), data)
    params = exp.initial_params
    assert personal_accuracies(exp, params, 0, steps=0) == client_accuracies(exp, params)
    moved = personal_accuracies(exp, params, 0, steps=1, lr=0.5)
    assert moved != client_accuracies(exp, params)


def test_personal_evaluation_one_step_equals_the_hand_computation(data: FederatedData) -> None:
    # logreg on 784 pixels: one SGD step of size lr on a batch drawn from the
    # client's own generator, then accuracy and loss on its held-out slice.
    cfg = _cfg(model="logreg", evaluation={"clients": True, "personal": {"steps": 1, "lr": 0.3}})
    exp = build(cfg, data)
    w = exp.initial_params
    rows = personal_accuracies(exp, w, round_idx=4)

    def loss(v: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = x.flatten(1) @ v[: 10 * 784].view(10, 784).T + v[10 * 784 :]
        return torch.nn.functional.cross_entropy(logits, y)

    assert [r[0] for r in rows] == list(range(6))
    for client_id, acc, mean_loss, n in rows:
        x, y = exp.data.client_data(client_id)
        gen = torch_generator(cfg.seed, "personal-eval", 4, client_id)
        idx = torch.randperm(len(y), generator=gen)[:8] if len(y) > 8 else torch.arange(len(y))
        tuned = w - 0.3 * torch.func.grad(loss)(w, x[idx], y[idx])
        hx, hy = exp.data.holdout_data(client_id)
        logits = hx.flatten(1) @ tuned[: 10 * 784].view(10, 784).T + tuned[10 * 784 :]
        assert n == len(hy)
        assert acc == pytest.approx(float((logits.argmax(1) == hy).double().mean()), abs=1e-12)
        assert mean_loss == pytest.approx(float(loss(tuned, hx, hy)), abs=1e-9)


def test_personal_lr_defaults() -> None:
    assert personal_lr(_cfg(lr=0.07)) == 0.07  # FedAvg + fine-tuning: the run's lr
    per = _cfg(algorithm="perfedavg", perfedavg={"alpha": 0.02})
    assert personal_lr(per) == 0.02  # Per-FedAvg: alpha, the step it was trained for
    assert (
        personal_lr(_cfg(evaluation={"clients": True, "personal": {"steps": 1, "lr": 0.4}})) == 0.4
    )


def test_end_to_end_run_records_personal_evaluation(tmp_path: Path, data: FederatedData) -> None:
    cfg = _cfg(
        tmp_path,
        algorithm="perfedavg",
        perfedavg={"variant": "hf", "hvp": "finite_difference", "alpha": 0.05, "steps": 2},
        evaluation={"clients": True, "personal": {"steps": 1}},
        engine="vectorized",
    )
    res = run(cfg, data)
    assert res.summary["engine"] == "serial"  # its own local loop: the vectorised engine falls back
    assert res.run_dir is not None
    store = RunStore.open(res.run_dir)
    try:
        personal = store.read_rows("personal_eval")
        glob = store.read_rows("client_eval")
        assert sorted({r[0] for r in personal}) == [0, 1]  # every evaluation round
        assert [r[1] for r in personal if r[0] == 1] == list(range(6))
        assert [r[4] for r in personal] == [r[4] for r in glob]  # the same held-out slices
        text = format_run_summary(store)
    finally:
        store.close()
    assert "personal  round 2: mean" in text and "clients   round 2: mean" in text


def test_vectorized_falls_back_with_the_reason(data: FederatedData) -> None:
    exp = build(_cfg(algorithm="perfedavg", engine="vectorized"), data)
    assert exp.engine.name == "serial"
    assert exp.note is not None and "runs its own local loop" in exp.note


@pytest.mark.all_cores
def test_worker_processes_equal_serial(make_data: MakeData, one_thread: None) -> None:
    small = make_data([7, 12, 5, 9, 10, 6], dtype=torch.float32)
    cfg = _cfg(algorithm="perfedavg", perfedavg={"variant": "hf", "steps": 2}, dtype="float32")
    one = run(cfg, small, store=False)
    two = run(override(cfg, {"workers": 2}), small, store=False)
    assert two.summary["engine"] == "serialx2"  # keeps nothing per client: may be spread
    assert torch.equal(one.params, two.params)


def test_local_epochs_is_one_meta_round() -> None:
    cfg = _cfg(algorithm="perfedavg", local_epochs=5)
    assert cfg.local_epochs == 1  # the resolved config says what runs: perfedavg.steps


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"algorithm": "perfedavg", "perfedavg": {"variant": "so"}}, "perfedavg.variant"),
        ({"algorithm": "perfedavg", "perfedavg": {"alpha": -0.1}}, "perfedavg.alpha"),
        ({"algorithm": "perfedavg", "perfedavg": {"beta": 0.0}}, "perfedavg.beta"),
        ({"algorithm": "perfedavg", "perfedavg": {"steps": 0}}, "perfedavg.steps"),
        ({"algorithm": "perfedavg", "perfedavg": {"hvp": "lbfgs"}}, "perfedavg.hvp"),
        ({"algorithm": "perfedavg", "perfedavg": {"delta": 0}}, "perfedavg.delta"),
        ({"algorithm": "perfedavg", "perfedavg": {"tau": 3}}, "perfedavg.tau"),
        ({"evaluation": {"personal": {"steps": 1}}}, "evaluation.personal.steps"),  # needs clients
        ({"evaluation": {"clients": True, "personal": {"steps": -1}}}, "evaluation.personal.steps"),
        ({"evaluation": {"clients": True, "personal": {"lr": 0}}}, "evaluation.personal.lr"),
        (  # null takes alpha = 0: personalisation steps of size 0
            {
                "algorithm": "perfedavg",
                "perfedavg": {"alpha": 0},
                "evaluation": {"clients": True, "personal": {"steps": 3}},
            },
            "evaluation.personal.lr",
        ),
        ({"algorithm": "perfedavg", "local": {"momentum": 0.9}}, "local.momentum"),
        ({"algorithm": "perfedavg", "stragglers": {"fraction": 0.5}}, "stragglers.fraction"),
        ({"algorithm": "perfedavg", "model": "cnn_bn"}, "model"),
        ({"algorithm": "perfedavg", "dtype": "float32", "precision": "bf16"}, "precision"),
    ],
)
def test_config_errors_name_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=f"'{field}'"):
        _cfg(**extra)


def test_the_start_line_shows_the_steps_a_perfedavg_run_takes() -> None:
    """Per-FedAvg's steps are alpha and beta (null beta: the run's lr), not lr."""
    from fedforge.config import step_sizes

    pfa = _cfg(algorithm="perfedavg", lr=0.1, perfedavg={"alpha": 0.03, "beta": 0.02, "steps": 4})
    assert step_sizes(pfa) == "alpha=0.03 beta=0.02 steps=4"
    assert step_sizes(_cfg(algorithm="perfedavg", lr=0.1)).startswith("alpha=0.01 beta=0.1 ")
    assert step_sizes(_cfg(lr=0.1)) == "lr=0.1"

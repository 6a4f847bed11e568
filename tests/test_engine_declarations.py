"""Engines change where, not what: the vectorised engine's fused perceptron path
is taken through declarations (a gradient hook's linear term, a model's chain
of linear layers), never by the class of an algorithm or model; whatever
declares nothing takes the generic vmap path. Both equal the serial engine in
float64."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch
from tests.test_vectorized import fused_calls
from torch import nn

from fedforge.algorithms import fedavg
from fedforge.algorithms.base import Algorithm
from fedforge.algorithms.fedprox import ProximalTerm, fedprox
from fedforge.algorithms.local import LinearTerm, StepContext, declared_linear_term
from fedforge.algorithms.plan import LocalPlan
from fedforge.algorithms.scaffold import CORRECTION, Correction, scaffold
from fedforge.client.runtime import ClientRuntime, ClientTask
from fedforge.core import wire
from fedforge.core.params import ParamSpec
from fedforge.engines import batched_mlp
from fedforge.engines.serial import SerialEngine
from fedforge.engines.vectorized import VectorizedEngine
from fedforge.models.logreg import LogisticRegression
from fedforge.models.mnist import MnistCNN, MnistMLP
from fedforge.store.client_state import make_state_store


class UndeclaredPull:
    """A user's hook that adds 0.3 (w - w_t) + 0.01 and declares nothing."""

    def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        diff = torch._foreach_sub(ctx.params, ctx.anchor)
        torch._foreach_add_(grads, diff, alpha=0.3)
        torch._foreach_add_(grads, 0.01)


class DeclaredPull:
    """A user's hook that declares its term, 0.3 (w - w_t)."""

    def linear_term(self) -> LinearTerm:
        return LinearTerm(proximal=0.3)

    def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        self.linear_term()(grads, ctx)


class TwoLayer(nn.Module):
    """A user's perceptron, 784-16-10, that declares its layers."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(784, 16)
        self.out = nn.Linear(16, 10)

    def perceptron_layers(self) -> tuple[str, ...]:
        return ("hidden", "out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(torch.relu(self.hidden(x.flatten(start_dim=1))))
        return out


class TwoLayerPlusScale(TwoLayer):
    """The same declaration, but a parameter outside the declared layers."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.scale


def _deltas(model: nn.Module, alg: Algorithm, clients: Sequence[int]) -> list[list[torch.Tensor]]:
    """The serial and the vectorised engines' deltas of one round of ``clients``
    (uneven, 5 to 13 examples of random 28x28 'digits'), in float64."""
    torch.manual_seed(0)
    model = model.double()
    spec = ParamSpec.of(model)
    gen = torch.Generator().manual_seed(1)
    data = {
        c: (
            torch.randn(5 + 2 * c, 1, 28, 28, generator=gen, dtype=torch.float64),
            torch.randint(0, 10, (5 + 2 * c,), generator=gen),
        )
        for c in clients
    }
    runtime = ClientRuntime(model, spec, alg, data.__getitem__)
    payload = wire.encode({"params": spec.flatten(model, torch.float64)})
    tasks = [ClientTask(c, 0, alg.plan(0), 7) for c in clients]
    return [
        [wire.decode(u.data).tensors["delta"] for u in engine.run_cohort(tasks, payload)]
        for engine in (SerialEngine(runtime), VectorizedEngine(runtime))
    ]


def _assert_same(serial: list[torch.Tensor], vector: list[torch.Tensor]) -> None:
    for a, b in zip(serial, vector, strict=True):
        assert a.abs().max() > 1e-4  # it trained
        torch.testing.assert_close(b, a, rtol=0, atol=1e-9)


def test_a_hook_that_declares_nothing_takes_the_generic_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = fused_calls(monkeypatch)
    alg = dataclasses.replace(fedavg(LocalPlan(2, 4, 0.05)), grad_hook=UndeclaredPull())
    assert declared_linear_term(alg.grad_hook) is None
    assert not batched_mlp.applies(MnistMLP(), alg, alg.plan(0), None)
    serial, vector = _deltas(MnistMLP(), alg, [0, 1, 2])
    assert calls == []
    _assert_same(serial, vector)
    plain, _ = _deltas(MnistMLP(), fedavg(LocalPlan(2, 4, 0.05)), [0, 1, 2])
    assert (plain[0] - serial[0]).abs().max() > 1e-6  # the hook's term matters here


def test_a_user_hook_that_declares_its_term_takes_the_fused_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = fused_calls(monkeypatch)
    alg = dataclasses.replace(fedavg(LocalPlan(2, 4, 0.05)), grad_hook=DeclaredPull())
    serial, vector = _deltas(MnistMLP(), alg, [0, 1, 2])
    assert calls and all(isinstance(t, batched_mlp.Terms) and t.mu == 0.3 for t in calls)
    _assert_same(serial, vector)


def test_a_user_model_that_declares_its_layers_takes_the_fused_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = fused_calls(monkeypatch)
    assert batched_mlp.mlp_layers(TwoLayer()) == ["hidden", "out"]
    serial, vector = _deltas(TwoLayer(), fedprox(LocalPlan(2, 4, 0.05), mu=0.5), [0, 1, 2])
    assert len(calls) == 1
    _assert_same(serial, vector)
    calls.clear()
    assert batched_mlp.mlp_layers(TwoLayerPlusScale()) is None  # its scale would not train
    serial, vector = _deltas(TwoLayerPlusScale(), fedavg(LocalPlan(2, 4, 0.05)), [0, 1, 2])
    assert calls == []
    _assert_same(serial, vector)


@pytest.mark.parametrize("model", [MnistMLP, LogisticRegression])
def test_fedprox_and_scaffold_declare_what_the_fused_path_takes(model: type[nn.Module]) -> None:
    """FedProx and SCAFFOLD on the 2NN and logistic regression: both declared,
    the fused path applies; the CNN declares no chain of linear layers."""
    net = model(784) if model is LogisticRegression else model()
    store = make_state_store(3, 1, torch.float64)
    state = {CORRECTION: torch.zeros(2, 1)}
    for alg, st in (
        (fedprox(LocalPlan(1, 10, 0.1), mu=0.1), None),
        (scaffold(LocalPlan(1, 10, 0.1), store), state),
    ):
        assert batched_mlp.applies(net, alg, alg.plan(0), st)
    assert batched_mlp.mlp_layers(MnistCNN()) is None
    assert declared_linear_term(ProximalTerm(0.1)) == LinearTerm(proximal=0.1)
    assert declared_linear_term(Correction()) == LinearTerm(state={CORRECTION: 1.0})


def test_the_fused_terms_combine_the_declared_state() -> None:
    """A term naming several client tensors gets their weighted sum as its shift;
    client state the term does not name leaves the fused path."""

    class Shifts:
        def linear_term(self) -> LinearTerm:
            return LinearTerm(proximal=0.2, state={"a": 2.0, "b": 1.0})

        def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
            self.linear_term()(grads, ctx)

    a, b = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    terms = batched_mlp.fused_terms(Shifts(), {"a": a, "b": b})
    assert terms is not None and terms.mu == 0.2 and terms.correction is not None
    torch.testing.assert_close(terms.correction, 2 * a + b, rtol=0, atol=0)
    assert batched_mlp.fused_terms(Shifts(), {"a": a}) is None
    assert batched_mlp.fused_terms(None, {"a": a}) is None
    assert batched_mlp.fused_terms(None, None) == batched_mlp.Terms()

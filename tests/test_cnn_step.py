"""McMahan's CNN with its SGD step written out (cnn_step.py) against the same
local training through autograd (client.local_sgd's general path): float64 to
1e-12, float32 to its rounding, bf16 against autocast; and where it applies."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fedforge.algorithms.base import LocalPlan, cross_entropy
from fedforge.client import cnn_step, deferred_sgd
from fedforge.client.runtime import LocalResult, local_sgd, minibatches
from fedforge.core.params import ParamSpec
from fedforge.models import MnistCNN, build_model
from fedforge.models.layout import CHANNELS_LAST, Conv2d, set_channels_last


def _plan(**kw: object) -> LocalPlan:
    base = {"local_epochs": 2, "batch_size": 4, "lr": 0.05}
    return LocalPlan(**{**base, **kw})  # type: ignore[arg-type]


def _data(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(14, 1, 28, 28, generator=gen, dtype=dtype)  # 14 = 3 x 4 + 2: a short batch
    return x, torch.randint(0, 10, (14,), generator=gen)


def _train(
    dtype: torch.dtype,
    plan: LocalPlan,
    written: bool,
    monkeypatch: pytest.MonkeyPatch,
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[LocalResult, torch.Tensor]:
    """Local SGD of a fresh CNN on ``data`` (default :func:`_data`), through the
    written-out step or, with ``written`` False, through autograd."""
    model = build_model("cnn", 1, dtype)
    spec = ParamSpec.of(model)
    start = spec.flatten(model, dtype)
    x, y = data if data is not None else _data(dtype)
    with monkeypatch.context() as m:
        if not written:
            m.setattr(cnn_step, "applies", lambda *args: False)
        else:
            assert cnn_step.applies(model, plan, cross_entropy, None, None, dtype)
        seed = torch.Generator().manual_seed(2)
        return local_sgd(model, spec, start, x, y, plan, cross_entropy, seed), start


@pytest.mark.parametrize(
    ("dtype", "atol"),
    [
        (torch.float64, 1e-12),
        (torch.float32, 2e-5),  # other kernels (oneDNN's input gradient): rounding
    ],
)
def test_written_step_equals_autograd(
    dtype: torch.dtype, atol: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan()
    written, start = _train(dtype, plan, True, monkeypatch)
    autograd, _ = _train(dtype, plan, False, monkeypatch)
    assert written.steps == autograd.steps == 8
    moved = (autograd.params - start).abs().max().item()
    assert moved > 2e-2  # it trained, well beyond the tolerance
    spec = ParamSpec.of(MnistCNN())
    for name, diff in spec.views(written.params - autograd.params).items():
        assert diff.abs().max().item() <= atol, name  # every layer, the convolutions too
    assert written.train_loss == pytest.approx(autograd.train_loss, abs=max(atol, 1e-6))


def test_deferred_fc1_steps_equal_autograd_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """fc1's deferred weight steps (bf16 runs only) checked in float64, where they
    must be SGD's to 1e-12: batches of 4, 4, 4, 2 twice; a forward sees up to 18
    deferred rows, folded at 22 and at the end."""
    monkeypatch.setattr(cnn_step, "DEFERRED", frozenset({torch.float64}))
    monkeypatch.setattr(deferred_sgd, "FOLD_ROWS", 20)
    calls = []
    monkeypatch.setattr(deferred_sgd.DeferredLinear, "fold", _counted(calls))
    plan = _plan()
    written, start = _train(torch.float64, plan, True, monkeypatch)
    autograd, _ = _train(torch.float64, plan, False, monkeypatch)
    assert calls == [22, 6]  # it deferred and folded
    assert (autograd.params - start).abs().max().item() > 2e-2
    assert (written.params - autograd.params).abs().max().item() <= 1e-12


def _counted(calls: list[int]) -> Callable[[deferred_sgd.DeferredLinear], None]:
    """``DeferredLinear.fold`` recording the rows each call folds."""
    fold = deferred_sgd.DeferredLinear.fold

    def counted(self: deferred_sgd.DeferredLinear) -> None:
        calls.append(self.rows)
        fold(self)

    return counted


def test_bf16_step_is_autocasts_but_for_the_fc_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One full-batch step under bf16: the convolutions take autocast's step bit
    for bit (their gradients flow back through the same bf16 products); the fully
    connected layers' differ by the bf16 rounding of their weight and bias
    gradients, which autocast does and the written-out step does not (lr |G| 2^-8)."""
    plan = _plan(precision="bf16", local_epochs=1, batch_size=None)
    written, start = _train(torch.float32, plan, True, monkeypatch)
    autograd, _ = _train(torch.float32, plan, False, monkeypatch)
    assert written.steps == autograd.steps == 1
    spec = ParamSpec.of(MnistCNN())
    ours, theirs, first = (spec.views(p) for p in (written.params, autograd.params, start))
    for name in ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"):
        assert torch.equal(ours[name], theirs[name]), name
        assert not torch.equal(ours[name], first[name]), name  # it stepped
    for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
        step = (theirs[name] - first[name]).abs()
        assert step.max() > 1e-4, name
        assert ((ours[name] - theirs[name]).abs() <= step * 2**-7 + 1e-7).all(), name
    assert written.train_loss == pytest.approx(autograd.train_loss, abs=1e-6)  # one forward


class _Linear16(torch.autograd.Function):
    """``x W^T + b`` in bf16 on fp32 weights, whose weight and bias gradients are
    fp32 products of the bf16 operands: the bf16 semantics cnn_step documents."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # type: ignore[no-untyped-def]
        half = weight.to(torch.bfloat16)
        ctx.save_for_backward(x, half)
        return torch.addmm(bias.to(torch.bfloat16), x, half.t())

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        x, half = ctx.saved_tensors
        return grad @ half, grad.float().t() @ x.float(), grad.float().sum(dim=0)


def _bf16_reference(
    start: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, plan: LocalPlan
) -> dict[str, torch.Tensor]:
    """Local SGD under that semantics through autograd, layer by layer."""
    p = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    gen = torch.Generator().manual_seed(2)
    bf = torch.bfloat16
    for _ in range(plan.local_epochs):
        for idx in minibatches(len(y), plan.batch_size, gen):
            a = x[idx].to(memory_format=CHANNELS_LAST).to(bf)  # the model's layout
            for conv in ("conv1", "conv2"):
                w = p[f"{conv}.weight"].to(memory_format=CHANNELS_LAST).to(bf)
                a = nn.functional.conv2d(a, w, p[f"{conv}.bias"].to(bf), padding=2)
                a = torch.relu(nn.functional.max_pool2d(a, 2))
            h = torch.relu(_Linear16.apply(a.flatten(1), p["fc1.weight"], p["fc1.bias"]))
            logits = _Linear16.apply(h, p["fc2.weight"], p["fc2.bias"])
            loss = nn.functional.cross_entropy(logits.float(), y[idx])
            grads = torch.autograd.grad(loss, list(p.values()))
            with torch.no_grad():
                for v, g in zip(p.values(), grads, strict=True):
                    v.add_(g.float(), alpha=-plan.lr)
    return {k: v.detach() for k, v in p.items()}


def test_bf16_steps_equal_a_reference_through_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight bf16 steps (a short last batch) against the reference above: the
    copies the written-out step keeps must follow every step. fc1's steps are
    folded in at every step here; deferred, its forward rounds differently (the
    thin products on the factors, tests/test_deferred_sgd.py), and bf16 training
    of this toy moves by 1e-3 from a 1e-6 change of its start."""
    monkeypatch.setattr(deferred_sgd, "FOLD_ROWS", 1)
    plan = _plan(precision="bf16")
    written, start = _train(torch.float32, plan, True, monkeypatch)
    spec = ParamSpec.of(MnistCNN())
    want = _bf16_reference(spec.views(start), *_data(torch.float32), plan)
    assert written.steps == 8
    for name, got in spec.views(written.params).items():
        moved = (want[name] - spec.views(start)[name]).abs().max().item()
        assert moved > 1e-3, name
        assert (got - want[name]).abs().max().item() <= 1e-5, name


class _OtherCNN(MnistCNN):
    pass


def _nchw() -> nn.Module:
    model = MnistCNN()
    set_channels_last(model, False)
    return model


def _strided() -> nn.Module:
    model = MnistCNN()
    model.conv2.stride = (2, 2)
    return model


def _reflect() -> nn.Module:
    model = MnistCNN()
    model.conv2.padding_mode = "reflect"
    return model


def _hooked() -> nn.Module:
    model = MnistCNN()
    model.conv1.register_forward_pre_hook(lambda module, args: (args[0] * 0,))
    return model


def _no_bias() -> nn.Module:
    model = MnistCNN()
    model.conv2 = Conv2d(32, 64, kernel_size=5, padding=2, bias=False)
    return model


def _other_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return cross_entropy(logits, labels) * 2


@pytest.mark.parametrize(
    ("model", "plan", "loss", "hook", "state", "dtype"),
    [
        (MnistCNN(), _plan(momentum=0.9), cross_entropy, None, None, torch.float32),
        (MnistCNN(), _plan(weight_decay=1e-4), cross_entropy, None, None, torch.float32),
        (MnistCNN(), _plan(grad_clip=1.0), cross_entropy, None, None, torch.float32),
        (MnistCNN(), _plan(), cross_entropy, object(), None, torch.float32),  # FedProx, SCAFFOLD
        (MnistCNN(), _plan(), cross_entropy, None, {"c": torch.zeros(1)}, torch.float32),
        (MnistCNN(), _plan(), _other_loss, None, None, torch.float32),
        (MnistCNN(), _plan(precision="bf16"), cross_entropy, None, None, torch.float64),
        (MnistCNN(), _plan(), cross_entropy, None, None, torch.float16),
        (_OtherCNN(), _plan(), cross_entropy, None, None, torch.float32),  # may change forward
        (_nchw(), _plan(), cross_entropy, None, None, torch.float32),  # the vectorised engine's
        (_strided(), _plan(), cross_entropy, None, None, torch.float32),  # changed in place
        (_reflect(), _plan(), cross_entropy, None, None, torch.float32),
        (_hooked(), _plan(), cross_entropy, None, None, torch.float32),
        (_no_bias(), _plan(), cross_entropy, None, None, torch.float32),
        (build_model("2nn", 0), _plan(), cross_entropy, None, None, torch.float32),
    ],
)
def test_autograd_wherever_the_written_step_would_differ(
    model: nn.Module, plan: LocalPlan, loss: object, hook: object, state: object, dtype: torch.dtype
) -> None:
    assert not cnn_step.applies(model, plan, loss, hook, state, dtype)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("fp32", torch.float32), ("fp32", torch.float64), ("bf16", torch.float32)],
)
def test_applies_to_plain_sgd(precision: str, dtype: torch.dtype) -> None:
    plan = _plan(precision=precision)
    assert cnn_step.applies(MnistCNN(), plan, cross_entropy, None, None, dtype)


def test_mean_over_the_batch_as_local_sgd_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loss is each example's, then their mean over the batch: a label -100
    (cross-entropy's ignore_index) counts as a zero loss, not as no example."""
    gen = torch.Generator().manual_seed(3)
    data = (torch.randn(6, 1, 28, 28, generator=gen, dtype=torch.float64),
            torch.tensor([3, -100, 1, -100, 7, 0]))  # fmt: skip
    plan = _plan(local_epochs=1, batch_size=None)
    written, _ = _train(torch.float64, plan, True, monkeypatch, data)
    autograd, _ = _train(torch.float64, plan, False, monkeypatch, data)
    assert written.train_loss == pytest.approx(autograd.train_loss, abs=1e-12)
    torch.testing.assert_close(written.params, autograd.params, rtol=0, atol=1e-12)


def test_the_written_out_step_follows_the_declaration_not_the_class() -> None:
    """The step applies to a model that declares it with exactly its layers: the
    CNN (any number of classes) and a copy of it under another class; not to a
    CNN that declares another kernel, nor to one with other layer sizes."""
    from fedforge.client.cnn_step import declares_kernel
    from fedforge.models.kernels import CNN_KERNEL

    class Copy(torch.nn.Module):
        def __init__(self, width: int = 512) -> None:
            super().__init__()
            built = MnistCNN()
            self.conv1, self.conv2 = built.conv1, built.conv2
            self.fc1, self.fc2 = torch.nn.Linear(3136, width), torch.nn.Linear(width, 10)

        def fused_kernel(self) -> str:
            return CNN_KERNEL

    class Other(MnistCNN):
        def fused_kernel(self) -> str:
            return "something_else"

    assert declares_kernel(MnistCNN()) and declares_kernel(MnistCNN(num_classes=5))
    assert declares_kernel(Copy())
    assert not declares_kernel(Copy(width=256))
    assert not declares_kernel(Other())
    assert not declares_kernel(torch.nn.Linear(3, 2))

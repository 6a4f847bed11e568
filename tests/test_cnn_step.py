"""McMahan's CNN with its SGD step written out (cnn_step.py) against the same
local training through autograd (client.local_sgd's general path): float64 to
1e-12, float32 to its rounding, bf16 against autocast; and where it applies."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedforge import cnn_step
from fedforge.algorithms.base import LocalPlan, cross_entropy
from fedforge.client import LocalResult, local_sgd
from fedforge.models import MnistCNN, build_model
from fedforge.models.layout import set_channels_last
from fedforge.params import ParamSpec


def _plan(**kw: object) -> LocalPlan:
    base = {"local_epochs": 2, "batch_size": 4, "lr": 0.05}
    return LocalPlan(**{**base, **kw})  # type: ignore[arg-type]


def _train(
    dtype: torch.dtype, plan: LocalPlan, written: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[LocalResult, torch.Tensor]:
    model = build_model("cnn", 1, dtype)
    spec = ParamSpec.of(model)
    start = spec.flatten(model, dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(14, 1, 28, 28, generator=gen, dtype=dtype)  # 14 = 3 x 4 + 2: a short batch
    y = torch.randint(0, 10, (14,), generator=gen)
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


def test_bf16_step_is_autocasts_but_for_the_fc_weight_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One full-batch step under bf16: the convolutions take autocast's step bit
    for bit (their gradients flow back through the same bf16 products); the fully
    connected layers' differ by the bf16 rounding of their weight gradient,
    which autocast does and the written-out step does not (lr |G| 2^-8)."""
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

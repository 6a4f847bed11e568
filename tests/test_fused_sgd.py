"""SGD folded into the backward pass of fully connected layers (fused_sgd.py):
the step is W - lr G^T X computed by hand, the input gradient is autograd's,
and whole local runs equal the unfused step in float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedforge import fused_sgd
from fedforge.algorithms.base import LocalPlan, cross_entropy
from fedforge.client import local_sgd
from fedforge.fused_sgd import fused_layers, sgd_in_backward
from fedforge.models import MnistCNN, build_model
from fedforge.params import ParamSpec


def test_linear_step_and_input_gradient_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_sgd, "BLOCK_FLOATS", 6)  # 2 rows a block: 3 blocks
    gen = torch.Generator().manual_seed(0)
    layer = nn.Linear(3, 5).double()
    w0, b0 = layer.weight.detach().clone(), layer.bias.detach().clone()
    x = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    model = nn.Sequential(layer)
    for p in layer.parameters():
        p.requires_grad_(False)
    with sgd_in_backward(model, ("0",), lr=0.1):
        out = model(x)
        ((out - target) ** 2).sum().backward()
    g = 2 * (x.detach() @ w0.t() + b0 - target)  # d loss / d out, by hand
    torch.testing.assert_close(x.grad, g @ w0, rtol=0, atol=1e-12)  # with W before the step
    torch.testing.assert_close(layer.weight, w0 - 0.1 * g.t() @ x.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(layer.bias, b0 - 0.1 * g.sum(dim=0), rtol=0, atol=1e-12)
    assert type(layer) is nn.Linear and "lr" not in vars(layer)  # restored


def _plan(**kw: object) -> LocalPlan:
    base = {"local_epochs": 2, "batch_size": 4, "lr": 0.05}
    return LocalPlan(**{**base, **kw})  # type: ignore[arg-type]


def test_cnn_local_sgd_equals_the_unfused_step(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_model("cnn", 1, torch.float64)
    spec = ParamSpec.of(model)
    start = spec.flatten(model, torch.float64)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(10, 1, 28, 28, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (10,), generator=gen)
    plan = _plan()
    assert fused_layers(model, plan, None, None) == ("fc1", "fc2")

    def train() -> torch.Tensor:
        result = local_sgd(
            model, spec, start, x, y, plan, cross_entropy, torch.Generator().manual_seed(2)
        )
        assert result.steps == 6
        return result.params

    fused = train()
    monkeypatch.setattr(fused_sgd, "FUSED_LAYERS", {})
    unfused = train()
    assert (unfused - start).abs().max() > 1e-3  # it trained
    moved_fc = spec.views(unfused - start)["fc1.weight"].abs().max()
    assert moved_fc > 1e-4  # and the fused layers moved
    torch.testing.assert_close(fused, unfused, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("plan", "hook", "state"),
    [
        (_plan(momentum=0.9), None, None),
        (_plan(weight_decay=1e-4), None, None),
        (_plan(grad_clip=1.0), None, None),
        (_plan(precision="bf16"), None, None),
        (_plan(), object(), None),  # an algorithm's gradient hook (FedProx, SCAFFOLD)
        (_plan(), None, {"c": torch.zeros(1)}),
    ],
)
def test_fused_only_for_plain_fp_sgd(plan: LocalPlan, hook: object, state: object) -> None:
    assert fused_layers(MnistCNN(), plan, hook, state) == ()


def test_nchw_convolutions_take_the_ordinary_step() -> None:
    """With channels_last off, a convolution saves a view of the flat vector for
    its backward, and the fused in-place step broke it ("modified by an inplace
    operation"); the ordinary step then runs, and trains."""
    from fedforge.models.layout import set_channels_last

    model = build_model("cnn", 1, torch.float64)
    set_channels_last(model, False)
    assert fused_layers(model, _plan(), None, None) == ()
    spec = ParamSpec.of(model)
    start = spec.flatten(model, torch.float64)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(10, 1, 28, 28, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (10,), generator=gen)
    seed = torch.Generator().manual_seed(2)
    result = local_sgd(model, spec, start, x, y, _plan(), cross_entropy, seed)
    assert (result.params - start).abs().max() > 1e-3


def test_fused_only_for_known_architectures() -> None:
    assert fused_layers(MnistCNN(), _plan(), None, None) == ("fc1", "fc2")
    assert fused_layers(build_model("2nn", 0), _plan(), None, None) == ()  # fc1 sees raw input


def test_a_layer_without_input_gradient_is_refused_and_restored() -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    refused = pytest.raises(RuntimeError, match="2-D input carrying a gradient")
    with refused, sgd_in_backward(model, ("0",), lr=0.1):
        model(torch.randn(4, 3))
    assert type(model[0]) is nn.Linear and "lr" not in vars(model[0])
    conv = nn.Sequential(nn.Conv2d(1, 1, 1))
    with pytest.raises(TypeError, match="plain nn.Linear"), sgd_in_backward(conv, ("0",), 0.1):
        pass

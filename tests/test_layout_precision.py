"""channels_last convolutions (models/layout.py) compute what NCHW ones compute;
``precision: bf16`` (precision.py) runs local forward passes in bf16 and keeps
everything else in fp32."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import MakeData
from torch import nn

from fedforge import config as config_mod
from fedforge.algorithms import cross_entropy
from fedforge.algorithms.base import LocalPlan
from fedforge.client.runtime import local_sgd
from fedforge.core import precision
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.models import build_model
from fedforge.models.layout import Conv2d, set_channels_last
from fedforge.server.experiment import build


@pytest.mark.parametrize("channels", [1, 8])
def test_channels_last_conv_equals_nchw_conv(channels: int) -> None:
    gen = torch.Generator().manual_seed(0)
    ours = Conv2d(channels, 16, kernel_size=5, padding=2).double()
    ref = nn.Conv2d(channels, 16, kernel_size=5, padding=2).double()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, channels, 12, 12, generator=gen, dtype=torch.float64)
    out, out_ref = ours(x), ref(x)
    torch.testing.assert_close(out, out_ref, rtol=0, atol=1e-12)
    assert out.is_contiguous(memory_format=torch.channels_last)  # really the NHWC path
    out.square().sum().backward()
    out_ref.square().sum().backward()
    assert ours.weight.grad is not None and ref.weight.grad is not None
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=0, atol=1e-10)
    assert ours.weight.grad.shape == ours.weight.shape
    set_channels_last(ours, False)
    assert ours(x).is_contiguous()  # switched off: the plain NCHW path


def test_cnn_keeps_its_parameters() -> None:
    """Same names, shapes and initial values as with torch's own Conv2d."""
    model = build_model("cnn", 0)
    assert sum(p.numel() for p in model.parameters()) == 1_663_370
    assert [n for n, _ in model.named_parameters()][:2] == ["conv1.weight", "conv1.bias"]


def _plan(precision_name: str) -> LocalPlan:
    return LocalPlan(local_epochs=1, batch_size=None, lr=0.05, precision=precision_name)


def test_bf16_local_training_stays_fp32_and_close(make_data: MakeData) -> None:
    data = make_data([32], dtype=torch.float32)
    model = build_model("cnn", 0)
    spec = ParamSpec.of(model)
    start = spec.flatten(model)
    x, y = data.train_x, data.train_y
    runs = {}
    for name in ("fp32", "bf16"):
        gen = torch.Generator().manual_seed(1)
        runs[name] = local_sgd(model, spec, start, x, y, _plan(name), cross_entropy, gen)
    fp32, bf16 = runs["fp32"].params, runs["bf16"].params
    assert bf16.dtype == torch.float32  # master weights and the update stay fp32
    delta32, delta16 = fp32 - start, bf16 - start
    assert not torch.equal(delta32, delta16)  # the forward really ran in bf16
    # One full-batch step: bf16 keeps 8 mantissa bits, so the step differs by a
    # few percent but points the same way (measured here: 4.7%, cosine 0.999).
    rel = float((delta16 - delta32).norm() / delta32.norm())
    cos = float(nn.functional.cosine_similarity(delta16, delta32, dim=0))
    assert rel < 0.1 and cos > 0.995, (rel, cos)


def test_bf16_forward_context_casts_matmuls() -> None:
    lin = nn.Linear(4, 3)
    with precision.forward_context("bf16"):
        assert lin(torch.randn(2, 4)).dtype == torch.bfloat16
    with precision.forward_context("fp32"):
        assert lin(torch.randn(2, 4)).dtype == torch.float32


def test_bf16_needs_float32_master_weights() -> None:
    with pytest.raises(ConfigError, match="precision.*bf16.*float64"):
        config_mod.Config(precision="bf16", dtype="float64")
    with pytest.raises(ConfigError, match="precision.*fp16.*'fp32', 'bf16'"):
        config_mod.from_dict({"precision": "fp16"})


def test_bf16_run_without_native_bf16_says_so(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    cfg = config_mod.Config(model="2nn", num_clients=2, precision="bf16", target_accuracy=None)
    exp = build(cfg, make_data([8, 8], dtype=torch.float32))
    assert exp.note is not None and "no AMX or AVX512-BF16" in exp.note
    assert exp.algorithm.plan(0).precision == "bf16"
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    assert precision.precision_note("bf16") is None
    assert precision.precision_note("fp32") is None

"""Batch-norm statistics recomputed on a client never seen in training
(``evaluation/unseen.py``): the exact per-channel mean and unbiased variance of
each batch norm's input over all of the client's examples, whatever the batch
size (a short last batch included)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedforge.core.params import ParamSpec
from fedforge.evaluation.unseen import recomputed_statistics
from fedforge.models import build_model

F64 = torch.float64


def _channels(t: torch.Tensor) -> torch.Tensor:
    """``[C, everything else]``: a batch norm's input with its channels first."""
    return t.transpose(0, 1).reshape(t.shape[1], -1)


def _cnn_bn_moments(
    w: dict[str, torch.Tensor], x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """cnn_bn's bn1 and bn2 moments over all of ``x`` at once, by hand with torch's
    functional ops: bn1's input is conv1's output; bn2's is conv2 of what follows
    bn1 normalised with bn1's exact moments (as the client is then evaluated)."""
    out1 = F.conv2d(x, w["conv1.weight"], w["conv1.bias"], padding=1)
    mean1, var1 = _channels(out1).mean(1), _channels(out1).var(1, unbiased=True)
    h = F.batch_norm(out1, mean1, var1, w["bn1.weight"], w["bn1.bias"], training=False)
    h = F.max_pool2d(torch.relu(h), 2)
    out2 = F.conv2d(h, w["conv2.weight"], w["conv2.bias"], padding=1)
    mean2, var2 = _channels(out2).mean(1), _channels(out2).var(1, unbiased=True)
    return mean1, var1, mean2, var2


def test_unequal_batches_give_the_moments_of_all_the_data() -> None:
    """10 examples in batches of 4 (4, 4, 2): every batch norm's running mean and
    variance are the mean and unbiased variance over all 10 examples and all
    spatial positions, not an average of per-batch figures (the cumulative
    average, momentum=None, fails this on the first batch norm already)."""
    model = build_model("cnn_bn", 0, F64)
    spec = ParamSpec.of(model, include_buffers=True)
    params = spec.flatten(model, F64)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(10, 1, 28, 28, dtype=F64, generator=gen) * 2 + 1
    x[8:] = x[8:] * 4 - 3  # the short last batch looks unlike the rest
    w = spec.views(params)
    mean1, var1, mean2, var2 = _cnn_bn_moments(w, x)
    got = spec.views(recomputed_statistics(model, spec, params, x, batch_size=4))
    torch.testing.assert_close(got["bn1.running_mean"], mean1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got["bn1.running_var"], var1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got["bn2.running_mean"], mean2, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got["bn2.running_var"], var2, rtol=1e-10, atol=1e-12)
    # the rest of the vector is what it was
    for name in ("conv1.weight", "bn1.weight", "bn1.bias", "bn2.weight", "fc2.bias"):
        assert torch.equal(got[name], w[name]), name


@pytest.mark.parametrize("batch_size", [1, 3, 7, 10, 64])
def test_the_batch_size_does_not_matter(batch_size: int) -> None:
    model = build_model("cnn_bn", 1, F64)
    spec = ParamSpec.of(model, include_buffers=True)
    params = spec.flatten(model, F64)
    x = torch.rand(10, 1, 28, 28, dtype=F64, generator=torch.Generator().manual_seed(4))
    whole = recomputed_statistics(model, spec, params, x, batch_size=10)
    got = recomputed_statistics(model, spec, params, x, batch_size=batch_size)
    torch.testing.assert_close(got, whole, rtol=1e-11, atol=1e-12)


def test_batch_norm_1d_and_float32_and_the_module_left_as_it_was() -> None:
    """A dense net with two BatchNorm1d (a batch of one included: eval-mode passes
    take it), float32 parameters: the statistics are the float64 moments of each
    layer's input cast to float32; the module's own tensors and mode are unchanged."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 4), nn.BatchNorm1d(4)
    )
    spec = ParamSpec.of(model, include_buffers=True)
    params = spec.flatten(model, torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(5)) * 3
    got = spec.views(recomputed_statistics(model, spec, params, x, batch_size=4))
    w = {k: v.to(F64) for k, v in spec.views(params).items()}
    xd = x.to(F64)
    a = F.linear(xd, w["0.weight"], w["0.bias"])
    m1, v1 = a.mean(0), a.var(0, unbiased=True)
    h = torch.relu(F.batch_norm(a, m1, v1, w["1.weight"], w["1.bias"], training=False))
    b = F.linear(h, w["3.weight"], w["3.bias"])
    m2, v2 = b.mean(0), b.var(0, unbiased=True)
    for name, want in (("1.running_mean", m1), ("1.running_var", v1)):
        torch.testing.assert_close(got[name], want.float(), rtol=1e-6, atol=1e-6)
    for name, want in (("4.running_mean", m2), ("4.running_var", v2)):
        torch.testing.assert_close(got[name], want.float(), rtol=1e-5, atol=1e-5)
    assert model.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_too_little_data_is_refused() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).to(F64)
    spec = ParamSpec.of(model, include_buffers=True)
    params = spec.flatten(model, F64)
    with pytest.raises(ValueError, match="at least two values"):
        recomputed_statistics(model, spec, params, torch.randn(1, 3, dtype=F64), batch_size=4)
    with pytest.raises(ValueError, match="no examples"):
        recomputed_statistics(model, spec, params, torch.randn(0, 3, dtype=F64), batch_size=4)

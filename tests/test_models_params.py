"""Models and ParamSpec: parameter counts worked out by hand from the paper's layer
shapes, the flat-vector round trip, zero-copy views (single and batched [K, P]),
parameter kinds, and seed-only initialisation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.models import MnistCNN, MnistMLP, build_model

# McMahan et al. 2017: 2NN = 784-200-200-10; CNN = conv5x5(1->32), pool, conv5x5(32->64),
# pool (28 -> 14 -> 7), fc 64*7*7 -> 512, fc 512 -> 10. Weights plus biases, layer by layer.
TWO_NN_SHAPES = {
    "fc1.weight": (200, 784),
    "fc1.bias": (200,),
    "fc2.weight": (200, 200),
    "fc2.bias": (200,),
    "fc3.weight": (10, 200),
    "fc3.bias": (10,),
}
CNN_SHAPES = {
    "conv1.weight": (32, 1, 5, 5),
    "conv1.bias": (32,),
    "conv2.weight": (64, 32, 5, 5),
    "conv2.bias": (64,),
    "fc1.weight": (512, 64 * 7 * 7),
    "fc1.bias": (512,),
    "fc2.weight": (10, 512),
    "fc2.bias": (10,),
}


def test_2nn_parameter_count_by_hand() -> None:
    by_hand = 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    assert by_hand == 199_210
    spec = ParamSpec.of(MnistMLP())
    assert spec.size == by_hand
    assert {e.name: e.shape for e in spec.entries} == TWO_NN_SHAPES


def test_cnn_parameter_count_by_hand() -> None:
    conv1 = 1 * 32 * 5 * 5 + 32
    conv2 = 32 * 64 * 5 * 5 + 64
    fc1 = 64 * 7 * 7 * 512 + 512
    fc2 = 512 * 10 + 10
    assert conv1 + conv2 + fc1 + fc2 == 1_663_370
    model = MnistCNN()
    spec = ParamSpec.of(model)
    assert spec.size == 1_663_370
    assert {e.name: e.shape for e in spec.entries} == CNN_SHAPES
    # The 64*7*7 input of fc1 is what the conv/pool stack really produces.
    out = model(torch.zeros(2, 1, 28, 28))
    assert tuple(out.shape) == (2, 10)


def test_spec_offsets_are_contiguous_in_parameter_order() -> None:
    spec = ParamSpec.of(MnistMLP())
    offset = 0
    for entry, name in zip(spec.entries, TWO_NN_SHAPES, strict=True):
        assert entry.name == name
        assert entry.offset == offset
        assert entry.slice == slice(offset, offset + entry.numel)
        assert entry.kind == "weight"
        offset += entry.numel
    assert offset == spec.size


def test_flatten_matches_concatenated_parameters() -> None:
    model = build_model("2nn", seed=1, dtype=torch.float64)
    spec = ParamSpec.of(model)
    vec = spec.flatten(model, torch.float64)
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert vec.dtype == torch.float64
    assert torch.equal(vec, expected)
    # fc2.bias lives at 784*200 + 200 + 200*200.
    start = 784 * 200 + 200 + 200 * 200
    assert torch.equal(vec[start : start + 200], model.fc2.bias.detach())


def test_flatten_keeps_the_modules_dtype_unless_told() -> None:
    model = nn.Linear(3, 2).double()
    with torch.no_grad():
        model.weight.fill_(1 / 3)
    vec = ParamSpec.of(model).flatten(model)
    assert vec.dtype == torch.float64 and vec[0].item() == 1 / 3
    assert ParamSpec.of(model).flatten(model, torch.float32).dtype == torch.float32


def test_batch_norm_with_a_cumulative_average_is_refused() -> None:
    """momentum=None averages over num_batches_tracked, an integer counter the flat
    vector does not carry: every client would share (and corrupt) one counter."""
    with pytest.raises(ValueError, match="batch norm '1' has momentum=None"):
        ParamSpec.of(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, momentum=None)))
    assert ParamSpec.of(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))).size == 24


def test_load_into_then_flatten_round_trip() -> None:
    model = MnistMLP().double()
    spec = ParamSpec.of(model)
    vec = torch.randn(spec.size, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    spec.load_into(model, vec)
    assert torch.equal(spec.flatten(model, torch.float64), vec)
    assert torch.equal(model.fc1.weight.detach(), vec[: 784 * 200].view(200, 784))
    assert torch.equal(model.fc3.bias.detach(), vec[-10:])
    # Loading copies: changing the vector afterwards leaves the module alone.
    vec.zero_()
    assert model.fc3.bias.detach().abs().sum() > 0


def test_views_are_zero_copy() -> None:
    spec = ParamSpec.of(MnistMLP())
    vec = torch.zeros(spec.size, dtype=torch.float64)
    views = spec.views(vec)
    assert {k: tuple(v.shape) for k, v in views.items()} == TWO_NN_SHAPES
    # Writing through a view changes the vector at exactly that entry's slot.
    views["fc2.bias"][7] = 5.0
    index = 784 * 200 + 200 + 200 * 200 + 7
    assert vec[index].item() == 5.0
    assert vec.count_nonzero().item() == 1
    # Writing the vector shows through the view.
    vec[1] = -2.0  # fc1.weight row 0, column 1
    assert views["fc1.weight"][0, 1].item() == -2.0
    for view in views.values():
        assert view.untyped_storage().data_ptr() == vec.untyped_storage().data_ptr()


def test_batched_views_of_k_by_p() -> None:
    spec = ParamSpec.of(MnistMLP())
    k = 3
    gen = torch.Generator().manual_seed(0)
    mat = torch.randn(k, spec.size, dtype=torch.float64, generator=gen)
    views = spec.views(mat)
    for name, shape in TWO_NN_SHAPES.items():
        assert tuple(views[name].shape) == (k, *shape)
        for row in range(k):
            assert torch.equal(views[name][row], spec.views(mat[row])[name])
    views["fc3.bias"][2, 9] = 123.0
    assert mat[2, -1].item() == 123.0
    assert (mat[:2, -1] != 123.0).all()


def test_wrong_length_vector_is_refused() -> None:
    spec = ParamSpec.of(MnistMLP())
    with pytest.raises(ValueError, match=str(spec.size)):
        spec.views(torch.zeros(spec.size - 1))
    with pytest.raises(ValueError):
        spec.load_into(MnistMLP(), torch.zeros(3, spec.size + 1))


def test_kinds_and_buffers_with_batch_norm() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    spec = ParamSpec.of(model)
    assert [(e.name, e.kind) for e in spec.entries] == [
        ("0.weight", "weight"),
        ("0.bias", "weight"),
        ("1.weight", "batchnorm"),
        ("1.bias", "batchnorm"),
    ]
    assert spec.size == 3 * 4 + 4 + 4 + 4
    assert spec.mask(("batchnorm",)).tolist() == [False] * 16 + [True] * 8
    assert int(spec.mask(("weight", "batchnorm")).sum()) == 24

    with_buffers = ParamSpec.of(model, include_buffers=True)
    # running_mean and running_var are floating buffers; num_batches_tracked (int64) is not.
    assert [e.name for e in with_buffers.entries if e.kind == "buffer"] == [
        "1.running_mean",
        "1.running_var",
    ]
    assert with_buffers.size == 24 + 8
    vec = with_buffers.flatten(model, torch.float64)
    assert vec[24:28].tolist() == [0.0] * 4 and vec[28:32].tolist() == [1.0] * 4
    vec[28:32] = torch.tensor([2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    with_buffers.load_into(model, vec)
    assert model[1].running_var.tolist() == [2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("name", ["2nn", "cnn"])
def test_model_init_depends_only_on_seed(name: str) -> None:
    torch.manual_seed(11)
    state_before = torch.get_rng_state()
    a = build_model(name, seed=5)
    # build_model leaves the caller's global generator where it was.
    assert torch.equal(torch.get_rng_state(), state_before)
    torch.manual_seed(999)  # a different global state must not matter
    b = build_model(name, seed=5)
    c = build_model(name, seed=6)
    spec = ParamSpec.of(a)
    va, vb, vc = (spec.flatten(m) for m in (a, b, c))
    assert torch.equal(va, vb)
    assert not torch.equal(va, vc)


def test_model_dtype_is_a_cast_of_the_same_init() -> None:
    m32 = build_model("2nn", seed=2)
    m64 = build_model("2nn", seed=2, dtype=torch.float64)
    spec = ParamSpec.of(m32)
    assert all(p.dtype == torch.float64 for p in m64.parameters())
    assert torch.equal(spec.flatten(m64, torch.float64), spec.flatten(m32).double())


def test_unknown_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="resnet"):
        build_model("resnet", seed=0)


def _paper_order_cnn(model: MnistCNN, x: torch.Tensor) -> torch.Tensor:
    """The CNN as the paper writes it: ReLU, then 2x2 max pooling."""
    pool = nn.functional.max_pool2d
    h = pool(torch.relu(model.conv1(x)), 2)
    h = pool(torch.relu(model.conv2(h)), 2)
    return model.fc2(torch.relu(model.fc1(h.flatten(start_dim=1))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cnn_pools_before_relu_with_the_same_values_and_gradients(dtype: torch.dtype) -> None:
    # MnistCNN pools first (a quarter of the elements through the ReLU); the
    # outputs and every gradient must equal the paper's order bit for bit.
    # The input has ties and all-negative windows: a zeroed image region and a
    # negative bias make whole pooling windows equal or below zero.
    model = build_model("cnn", seed=3, dtype=dtype)
    with torch.no_grad():
        model.conv1.bias[:8] = -5.0
    x = torch.rand(6, 1, 28, 28, generator=torch.Generator().manual_seed(0), dtype=dtype)
    x[:, :, :10, :10] = 0.0
    y = torch.tensor([0, 1, 2, 3, 4, 5])
    params = list(model.parameters())

    def grads(forward: object) -> tuple[torch.Tensor, list[torch.Tensor]]:
        out = forward(model, x) if forward is not None else model(x)  # type: ignore[operator]
        loss = nn.functional.cross_entropy(out, y)
        return out.detach(), list(torch.autograd.grad(loss, params))

    out_ours, g_ours = grads(None)
    out_paper, g_paper = grads(_paper_order_cnn)
    assert torch.equal(out_ours, out_paper)
    for a, b in zip(g_ours, g_paper, strict=True):
        assert torch.equal(a, b)
    # The all-negative windows exist: some pooled pre-activations are <= 0.
    assert bool((nn.functional.max_pool2d(model.conv1(x), 2) <= 0).any())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64]
)
def test_all_finite_agrees_with_isfinite_everywhere(threads: int, dtype: torch.dtype) -> None:
    """A NaN or an infinity at the start, the middle (a thread's boundary) or the
    end of a long vector, alone or mixed; and finite extremes near the dtype's max."""
    from fedforge.core.params import all_finite

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 199_210
        gen = torch.Generator().manual_seed(0)
        base = torch.randn(n, generator=gen).to(dtype)
        big = torch.finfo(dtype).max
        cases = [base, base[:0], torch.full((5,), big, dtype=dtype)]
        cases.append(torch.tensor([big, -big], dtype=dtype))
        for bad in (float("nan"), float("inf"), -float("inf")):
            for pos in (0, n // 2 - 1, n // 2, n - 1):
                t = base.clone()
                t[pos] = bad
                cases.append(t)
        mixed = base.clone()
        mixed[3], mixed[-3] = float("inf"), -float("inf")
        cases.append(mixed)
        if dtype.is_complex:  # the imaginary parts too
            for bad in (float("nan"), float("inf")):
                t = base.clone()
                t[n // 2] = complex(1.0, bad)
                cases.append(t)
        for t in cases:
            assert all_finite(t) == bool(torch.isfinite(t).all()), t[:3]
        with_grad = base.clone().requires_grad_(True)
        assert all_finite(with_grad)
        assert all_finite(torch.arange(4))  # integers are finite
    finally:
        torch.set_num_threads(before)

"""Parameter subsets kept on the clients (local_params) with any algorithm:
FedBN's local batch norm composed with FedAvg, FedProx and SCAFFOLD, and
"share only batch norm"."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import MakeData

from fedforge.algorithms.fedbn import local_mask
from fedforge.algorithms.subsets import subset_mask
from fedforge.config import from_dict
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.data.federated import FederatedData
from fedforge.models import build_model
from fedforge.server.experiment import build
from fedforge.server.loop import run

F64 = torch.float64
LOCAL_BN = {"kinds": ["batchnorm", "buffer"]}
BASE: dict[str, Any] = {
    "model": "cnn_bn",
    "num_clients": 5,
    "client_fraction": 0.6,
    "local_epochs": 1,
    "batch_size": 8,
    "lr": 0.05,
    "rounds": 3,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data([20, 12, 17, 9, 14], dtype=F64)


def _run(data: FederatedData, **extra: Any) -> torch.Tensor:
    return run(from_dict({**BASE, **extra}), data, store=False).params


def test_subset_mask_by_kind_and_by_name() -> None:
    spec = ParamSpec.of(build_model("cnn_bn", 0, F64), include_buffers=True)
    # kinds [weight]: exactly the complement of FedBN's local entries
    assert torch.equal(subset_mask(spec, ("weight",), None), ~local_mask(spec))
    fc2 = subset_mask(spec, (), r"^fc2\.")
    want = torch.zeros(spec.size, dtype=torch.bool)
    views = spec.views(torch.arange(spec.size))
    for name in ("fc2.weight", "fc2.bias"):
        want[views[name].reshape(-1)] = True
    assert torch.equal(fc2, want)
    assert int(fc2.sum()) == 128 * 10 + 10  # cnn_bn's last layer: 128 -> 10
    # kind and name together: their union
    both = subset_mask(spec, ("batchnorm", "buffer"), r"^fc2\.")
    assert torch.equal(both, local_mask(spec) | fc2)


def test_fedavg_and_fedprox_with_local_batch_norm_are_fedbn(data: FederatedData) -> None:
    """FedBN is FedAvg with local batch norm; FedProx at mu = 0 is FedAvg: both
    compositions give FedBN's model to the bit, and FedProx at mu > 0 does not."""
    fedbn = _run(data, algorithm="fedbn")
    assert torch.equal(_run(data, algorithm="fedavg", local_params=LOCAL_BN), fedbn)
    prox0 = _run(data, algorithm="fedprox", fedprox={"mu": 0.0}, local_params=LOCAL_BN)
    assert torch.equal(prox0, fedbn)
    prox = _run(data, algorithm="fedprox", fedprox={"mu": 0.5}, local_params=LOCAL_BN)
    assert not torch.equal(prox, fedbn)
    exp = build(from_dict({**BASE, "algorithm": "fedprox", "local_params": LOCAL_BN}), data)
    mask = local_mask(exp.spec)
    assert exp.algorithm.grad_hook is not None  # FedProx's term is still there
    assert torch.equal(prox[mask], exp.initial_params[mask])  # the global batch norm never moves


def test_scaffold_with_local_batch_norm_keeps_bn_rows_on_the_clients(
    data: FederatedData,
) -> None:
    cfg = from_dict({**BASE, "algorithm": "scaffold", "local_params": LOCAL_BN})
    exp = build(cfg, data)
    mask = local_mask(exp.spec)
    res = run(cfg, data, store=False)
    assert torch.equal(res.params[mask], exp.initial_params[mask])  # the server never moved them
    assert not torch.equal(res.params[~mask], exp.initial_params[~mask])
    plain = run(from_dict({**BASE, "algorithm": "scaffold"}), data, store=False).params
    assert not torch.equal(plain[mask], exp.initial_params[mask])  # plain SCAFFOLD averages them
    # the clients hold their own batch norm, each trained away from the global one
    store = exp.algorithm.personal.store  # type: ignore[union-attr]
    assert exp.algorithm.client is not None  # SCAFFOLD's controls are still there
    run_round_all(exp)
    rows = store.gather(store.written())
    assert len(rows) >= 3 and not torch.equal(rows[0], rows[1])
    assert all(not torch.equal(r, exp.initial_params[mask]) for r in rows)


def run_round_all(exp: Any) -> None:
    """One round of ``exp`` on its own state (its tables filled as a run fills them)."""
    from fedforge.report.progress import Progress
    from fedforge.server.round import run_round
    from fedforge.server.state import LoopState

    run_round(exp, LoopState.fresh(exp), 0, Progress(1, "t", enabled=False))


def test_share_only_batch_norm_keeps_every_weight_local(data: FederatedData) -> None:
    cfg = from_dict({**BASE, "algorithm": "fedavg", "local_params": {"kinds": ["weight"]}})
    exp = build(cfg, data)
    local = subset_mask(exp.spec, ("weight",), None)
    res = run(cfg, data, store=False)
    assert torch.equal(res.params[local], exp.initial_params[local])
    # the shared batch norm is the mean of the cohort's: it moved
    assert not torch.equal(res.params[~local], exp.initial_params[~local])


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"local_params": {"names": "fc2.(["}}, "local_params.names"),
        ({"algorithm": "fedbn", "local_params": LOCAL_BN}, "keeps its own entries"),
        ({"model": "2nn", "local_params": LOCAL_BN}, "selects no entry"),
        ({"local_params": {"kinds": ["weight", "batchnorm"]}}, "nothing would be shared"),
        ({"local_params": {"kinds": ["bias"]}}, "local_params.kinds"),
    ],
)
def test_bad_local_params_are_one_line(data: FederatedData, extra: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        build(from_dict({**BASE, **extra}), data)
    assert "\n" not in str(err.value)


def test_recomputed_statistics_are_the_clients_own_channel_moments() -> None:
    """One batch: bn1's running mean and variance become the per-channel mean and
    unbiased variance of conv1's output over the client's images, computed by hand;
    nothing else of the vector moves and the module is left as it was."""
    from fedforge.evaluation.unseen import recomputed_statistics

    model = build_model("cnn_bn", 0, F64)
    spec = ParamSpec.of(model, include_buffers=True)
    params = spec.flatten(model, F64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(30, 1, 28, 28, dtype=F64, generator=torch.Generator().manual_seed(1)) * 3 + 2
    got = spec.views(recomputed_statistics(model, spec, params, x, batch_size=30))
    w = spec.views(params)
    out = torch.nn.functional.conv2d(x, w["conv1.weight"], w["conv1.bias"], padding=1)
    per_channel = out.transpose(0, 1).reshape(16, -1)
    assert torch.allclose(got["bn1.running_mean"], per_channel.mean(1))
    assert torch.allclose(got["bn1.running_var"], per_channel.var(1, unbiased=True))
    for name in ("conv1.weight", "bn1.weight", "bn2.bias", "fc2.weight"):
        assert torch.equal(got[name], w[name])
    assert not torch.equal(got["bn2.running_mean"], w["bn2.running_mean"])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # two batches: still the moments over all 30 images (tests/test_unseen.py:
    # unequal batches and every batch norm)
    two = spec.views(recomputed_statistics(model, spec, params, x, batch_size=15))
    assert torch.allclose(two["bn1.running_mean"], per_channel.mean(1))
    assert torch.allclose(two["bn1.running_var"], per_channel.var(1, unbiased=True))

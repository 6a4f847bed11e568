"""The server's proxy set (config ``proxy:``, server/proxy.py, data/proxy.py):
carved class-balanced from rows no client then holds, never from the test set;
SGD on it after each server step equal to plain torch SGD on the proxy set; the
rows of missing classes given only to the clients short of them, their bytes
counted once per client."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

import fedforge
from fedforge.config import from_dict, override
from fedforge.core import wire
from fedforge.core.errors import ConfigError
from fedforge.core.rng import torch_generator
from fedforge.data.user import from_tensors
from fedforge.server.experiment import build
from fedforge.server.proxy import ProxyTuned, assemble
from fedforge.server.state import server_optimizer
from fedforge.store import RunStore

CLASSES = 3


def _data(seed: int = 0):
    """12 rows a client over 4 clients; client 0 holds every class, client 1 lacks
    class 2, clients 2 and 3 hold class 0 alone."""
    g = torch.Generator().manual_seed(seed)
    labels = [[0, 1, 2] * 4, [0, 1] * 6, [0] * 12, [0] * 12]
    y = torch.tensor([c for client in labels for c in client])
    x = torch.randn(len(y), 5, generator=g, dtype=torch.float64) + y[:, None]
    test_x = torch.randn(30, 5, generator=g, dtype=torch.float64) + 100.0  # far from train
    test_y = torch.arange(30) % CLASSES
    owner = torch.arange(len(y)) // 12
    return from_tensors(x, y, test_x, test_y, owner, num_classes=CLASSES, dtype=torch.float64)


def _cfg(tmp_path, **proxy):
    return from_dict(
        {
            "name": "proxy",
            "model": "logreg",
            "dtype": "float64",
            "num_clients": 4,
            "client_fraction": 1.0,
            "local_epochs": 1,
            "batch_size": 4,
            "lr": 0.1,
            "rounds": 2,
            "target_accuracy": None,
            "engine": "serial",
            "proxy": proxy,
            "runs_dir": str(tmp_path),
        }
    )


def test_proxy_set_is_class_balanced_and_no_client_holds_it(tmp_path) -> None:
    data = _data()
    exp = build(_cfg(tmp_path, size=4), data)
    proxy = exp.proxy
    assert proxy is not None
    labels = data.train_y.numpy()
    # 4 rows over 3 classes: 2, 1, 1 (the first size % C classes one more)
    assert np.bincount(labels[proxy.rows], minlength=CLASSES).tolist() == [2, 1, 1]
    held = np.concatenate([np.asarray(i) for i in exp.data.partition.client_indices])
    assert not set(held) & set(proxy.rows.tolist())
    # every other row is still its client's, in its order
    for c in range(4):
        before = np.asarray(data.partition.client_indices[c])
        kept = before[~np.isin(before, proxy.rows)]
        assert np.asarray(exp.data.partition.client_indices[c]).tolist() == kept.tolist()
    assert torch.equal(proxy.x, data.train_x[proxy.rows])
    assert torch.equal(proxy.y, data.train_y[proxy.rows])
    assert (proxy.x < 50).all() and (data.test_x > 50).all()  # no test row among them


def test_mnist_proxy_set_disjoint_from_clients_and_test_images(tmp_path, mnist_dir) -> None:
    cfg = from_dict(
        {
            "name": "proxy-mnist",
            "num_clients": 100,
            "partition": {"kind": "shards", "shards_per_client": 2},
            "evaluation": {"clients": True},
            "proxy": {"size": 300},
            "runs_dir": str(tmp_path),
            "data_dir": str(mnist_dir),
        }
    )
    exp = build(cfg)
    rows = exp.proxy.rows
    assert np.bincount(exp.data.train_y[rows].numpy(), minlength=10).tolist() == [30] * 10
    for part in (exp.data.partition, exp.data.holdout):
        held = np.concatenate([np.asarray(i) for i in part.client_indices])
        assert not np.isin(rows, held).any()
    test = {bytes(r.numpy().tobytes()) for r in exp.data.test_x}
    assert not any(bytes(r.numpy().tobytes()) in test for r in exp.proxy.x)


class _LogReg(nn.Module):
    """The logreg model written again: one linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, CLASSES, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _sgd(params: torch.Tensor, x, y, batches, lr: float, exp) -> torch.Tensor:
    """Plain torch SGD from the flat ``params`` over ``batches`` of rows."""
    model = _LogReg()
    exp.spec.load_into(model, params)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for idx in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return exp.spec.flatten(model, torch.float64)


def test_tuning_is_plain_sgd_on_the_proxy_set(tmp_path) -> None:
    cfg = _cfg(tmp_path, size=6, tune_epochs=2, tune_lr=0.3, tune_batch_size=4)
    exp = build(cfg, _data())
    assert exp.spec.names == ("fc.weight", "fc.bias")
    optimizer = server_optimizer(exp)
    assert isinstance(optimizer, ProxyTuned)
    x, y = exp.proxy.x, exp.proxy.y
    params = exp.initial_params.clone()
    for t in range(2):  # each step's minibatch order is derived from its own count
        aggregate = torch.randn(exp.spec.size, dtype=torch.float64)
        got = optimizer.step(params, aggregate)
        gen = torch_generator(cfg.seed, "proxy", t)
        order = [torch.randperm(6, generator=gen).split(4) for _ in range(2)]
        want = _sgd(params + aggregate, x, y, [b for epoch in order for b in epoch], 0.3, exp)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        params = got
    saved = optimizer.state_dict()
    again = server_optimizer(exp)
    again.load_state_dict(saved)  # a resumed run tunes its next step as this one would
    aggregate = torch.randn(exp.spec.size, dtype=torch.float64)
    assert torch.equal(again.step(params, aggregate), optimizer.step(params, aggregate))


def test_a_tuned_round_is_the_untuned_round_then_sgd(tmp_path) -> None:
    plain = fedforge.run(dataclasses.replace(_cfg(tmp_path, size=6), rounds=1), _data())
    cfg = dataclasses.replace(
        _cfg(tmp_path, size=6, tune_epochs=3, tune_lr=0.5, tune_batch_size=None), rounds=1
    )
    tuned = fedforge.run(cfg, _data())
    exp = build(cfg, _data())
    whole = [torch.arange(6)] * 3  # full batches: the order does not matter
    want = _sgd(plain.params, exp.proxy.x, exp.proxy.y, whole, 0.5, exp)
    torch.testing.assert_close(tuned.params, want, rtol=0, atol=1e-12)


def test_filled_rows_reach_only_clients_short_of_classes_and_are_counted(tmp_path) -> None:
    data = _data()
    exp = build(_cfg(tmp_path, size=6, fill_missing=True), data)
    labels = data.train_y.numpy()
    rows = exp.proxy.rows
    of = {c: rows[labels[rows] == c].tolist() for c in range(CLASSES)}
    assert [len(v) for v in of.values()] == [2, 2, 2]
    given = [g.tolist() for g in exp.proxy.given]
    assert given == [[], of[2], of[1] + of[2], of[1] + of[2]]
    for c in range(4):  # what each client trains on: its rows less the proxy's, and its gift
        x, y = exp.client_train_data(c)
        own = [r for r in data.partition.client_indices[c] if r not in rows]
        assert torch.equal(x, data.train_x[own + given[c]])
        assert torch.equal(y, data.train_y[own + given[c]])
    filled = fedforge.run(_cfg(tmp_path, size=6, fill_missing=True), data)
    plain = fedforge.run(_cfg(tmp_path, size=6), data)
    # every client asked in round 0 gets its rows then; none again in round 1
    sent = sum(len(wire.encode({"x": data.train_x[g], "y": data.train_y[g]})) for g in given if g)
    assert sent > 5 * 8 * 5  # 5 rows of 5 float64 inputs, at least
    down = [f.bytes_down - p.bytes_down for f, p in zip(filled.rounds, plain.rounds, strict=True)]
    assert down == [sent, 0]


def test_filled_rows_are_counted_when_a_client_is_first_asked(tmp_path) -> None:
    data = _data()
    cfg = dataclasses.replace(_cfg(tmp_path, size=6, fill_missing=True), client_fraction=0.5)
    cfg = dataclasses.replace(cfg, rounds=6)
    filled = fedforge.run(cfg, data)
    plain = fedforge.run(dataclasses.replace(cfg, proxy=_cfg(tmp_path, size=6).proxy), data)
    exp = build(cfg, data)
    cost = [
        len(wire.encode({"x": data.train_x[g], "y": data.train_y[g]})) if len(g) else 0
        for g in exp.proxy.given
    ]
    with RunStore.open(filled.run_dir) as store:
        cohorts = {}
        for r, client, _ in store.read_rows("cohorts"):
            cohorts.setdefault(r, []).append(client)
    seen: set[int] = set()
    want = []
    for r in range(6):
        new = [c for c in cohorts[r] if c not in seen]
        seen.update(new)
        want.append(sum(cost[c] for c in new))
    down = [f.bytes_down - p.bytes_down for f, p in zip(filled.rounds, plain.rounds, strict=True)]
    assert down == want
    assert sum(down) == sum(cost[c] for c in seen)


@pytest.mark.parametrize(
    ("proxy", "extra", "says"),
    [
        ({"size": -1}, {}, "'proxy.size' = -1"),
        ({"size": 10, "tune_lr": 0.0}, {}, "'proxy.tune_lr' = 0"),
        ({"size": 10, "tune_batch_size": 0}, {}, "'proxy.tune_batch_size' = 0"),
        ({"tune_epochs": 2}, {}, "must be >= 1 with proxy.tune_epochs > 0"),
        ({"fill_missing": True}, {}, "must be >= 1 with proxy.fill_missing"),
        (
            {"size": 10, "fill_missing": True},
            {"privacy": {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0}},
            "proxy.fill_missing with privacy.dp = 'central'",
        ),
        (
            {"size": 10, "fill_missing": True},
            {"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}},
            "proxy.fill_missing with privacy.secagg",
        ),
        (
            {"size": 10},
            {"deployment": {"client_data": "remote"}, "robust": {"max_weight_ratio": 10}},
            "client_data = 'remote'",
        ),
    ],
)
def test_bad_proxy_settings_are_one_line(proxy, extra, says) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"proxy": proxy, **extra})
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_tuning_composes_with_central_dp() -> None:
    """Tuning on public data is post-processing of the noised model: accepted."""
    dp = {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0}
    cfg = from_dict({"proxy": {"size": 10, "tune_epochs": 1}, "privacy": dp})
    assert cfg.proxy.tunes


def test_proxy_needs_class_labels(tmp_path) -> None:
    data = _data()
    floats = dataclasses.replace(data, train_y=data.train_y.double(), num_classes=None)
    with pytest.raises(ConfigError, match="needs one class id a row"):
        assemble(_cfg(tmp_path, size=4), floats)


@pytest.mark.parametrize("algorithm", ["cfl", "ifca", "fedavg"])
@pytest.mark.parametrize(
    ("use", "says"),
    [
        ({"tune_epochs": 1}, "proxy.tune_epochs > 0 with partition.concept_shift = 2"),
        ({"fill_missing": True}, "proxy.fill_missing with partition.concept_shift = 2"),
    ],
)
def test_proxy_uses_refuse_a_concept_shift(tmp_path, algorithm, use, says) -> None:
    """Carved from clients whose labels follow two maps, the proxy set would hold
    contradictory labels: tuning and filling are refused when the run is built;
    the set carved and unused is accepted."""
    shifted = {"algorithm": algorithm, "partition": {"kind": "iid", "concept_shift": 2}}
    with pytest.raises(ConfigError) as err:
        build(override(_cfg(tmp_path, size=6, **use), shifted), _data())
    assert says in str(err.value)
    assert "use partition.concept_shift = 0, or proxy.tune_epochs = 0 and" in str(err.value)
    assert "\n" not in str(err.value)
    exp = build(override(_cfg(tmp_path, size=6), shifted), _data())
    assert exp.proxy is not None and exp.data.concepts is not None

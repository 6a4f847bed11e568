"""Issue 4 data: label-noise partitions (noisy clients), the flip rules by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.conftest import TINY_LOGREG, MakeData

from fedforge.config import from_dict
from fedforge.core.errors import ConfigError, PartitionError
from fedforge.data.noise import flip_labels, noisy_client_ids, noisy_labels
from fedforge.server.experiment import build
from fedforge.server.loop import run


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_pair_rule_by_hand() -> None:
    y = torch.tensor([0, 3, 9, 5])
    assert flip_labels(y, "pair", 1.0, 10, rng()).tolist() == [1, 4, 0, 6]
    assert y.tolist() == [0, 3, 9, 5]  # a copy: the input is untouched


def test_symmetric_rule_changes_every_label_uniformly_to_another_class() -> None:
    y = torch.arange(10).repeat(9000)  # 90,000 labels, each class alike
    out = flip_labels(y, "symmetric", 1.0, 10, rng(1))
    assert bool((out != y).all())
    offsets = ((out - y) % 10).numpy()
    counts = np.bincount(offsets, minlength=10)
    assert counts[0] == 0
    # uniform over the 9 other classes: each offset 10,000 expected, sd ~ 94
    assert np.abs(counts[1:] - 10_000).max() < 500
    # per true class too: the new label is uniform over the other nine
    for c in (0, 7):
        got = np.bincount(out[y == c].numpy(), minlength=10)
        assert got[c] == 0 and np.abs(got[np.arange(10) != c] - 1000).max() < 160


@pytest.mark.parametrize("rule", ["symmetric", "pair"])
@pytest.mark.parametrize(("n", "rate", "changed"), [(100, 0.3, 30), (7, 0.5, 4), (10, 1.0, 10)])
def test_rate_is_the_exact_fraction_relabelled(
    rule: str, n: int, rate: float, changed: int
) -> None:
    y = torch.arange(n) % 10
    out = flip_labels(y, rule, rate, 10, rng(2))
    assert int((out != y).sum()) == changed  # round(rate * n); both rules always change a label
    assert torch.equal(out, flip_labels(y, rule, rate, 10, rng(2)))


def test_noisy_clients_are_a_seeded_fraction() -> None:
    ids = noisy_client_ids(20, 0.25, seed=3)
    assert len(ids) == 5 and list(ids) == sorted(set(ids)) and max(ids) < 20
    assert ids == noisy_client_ids(20, 0.25, seed=3)
    assert ids != noisy_client_ids(20, 0.25, seed=4)
    assert noisy_client_ids(20, 0.0, seed=3) == ()
    assert noisy_client_ids(20, 1.0, seed=3) == tuple(range(20))
    assert len(noisy_client_ids(10, 0.35, seed=0)) == 4  # round(3.5) = 4
    with pytest.raises(PartitionError, match="must be in"):
        noisy_client_ids(20, 1.5, seed=3)
    with pytest.raises(PartitionError, match="'random' is invalid: must be one of"):
        flip_labels(torch.zeros(3, dtype=torch.int64), "random", 1.0, 10, rng())


def test_noisy_labels_touch_only_noisy_clients(make_data: MakeData) -> None:
    data = make_data([20, 20, 20, 20])
    out = noisy_labels(data.train_y, data.partition, (1, 3), "pair", 1.0, 10, seed=0)
    for client_id, idx in enumerate(data.partition.client_indices):
        rows = torch.tensor(idx)
        want = (data.train_y[rows] + 1) % 10 if client_id in (1, 3) else data.train_y[rows]
        assert torch.equal(out[rows], want)


BASE: dict[str, Any] = dict(TINY_LOGREG)


def test_build_records_noisy_clients(make_data: MakeData, tmp_path: Path) -> None:
    data = make_data([10, 10, 10, 10])
    part = {"label_noise": 0.5, "label_noise_rule": "symmetric", "label_noise_rate": 0.5}
    cfg = from_dict({**BASE, "partition": part, "runs_dir": str(tmp_path)})
    exp = build(cfg, data)
    noisy = noisy_client_ids(4, 0.5, cfg.seed)
    assert exp.data.noisy_clients == noisy and len(noisy) == 2
    for client_id, idx in enumerate(data.partition.client_indices):
        rows = torch.tensor(idx)
        changed = int((exp.data.train_y[rows] != data.train_y[rows]).sum())
        assert changed == (5 if client_id in noisy else 0)
    assert torch.equal(exp.data.train_x, data.train_x)  # features untouched
    assert torch.equal(build(cfg, exp.data).data.train_y, exp.data.train_y)  # applied once
    result = run(cfg, data=data)
    assert result.run_dir is not None
    written = json.loads((result.run_dir / "partition.json").read_text())
    assert written["noisy_clients"] == list(noisy)
    # the label histograms are those of the labels the clients hold
    held = [
        np.bincount(exp.data.train_y[torch.tensor(idx)].numpy(), minlength=10).tolist()
        for idx in data.partition.client_indices
    ]
    assert written["label_counts"] == held


def test_config_refuses_bad_noise() -> None:
    with pytest.raises(ConfigError, match=r"'partition\.label_noise' = 1\.5.*\[0, 1\]"):
        from_dict({**BASE, "partition": {"label_noise": 1.5}})
    with pytest.raises(ConfigError, match=r"'partition\.label_noise_rate' = 0\.0.*\(0, 1\]"):
        from_dict({**BASE, "partition": {"label_noise": 0.5, "label_noise_rate": 0.0}})
    with pytest.raises(ConfigError, match=r"label_noise_rule.*'flip'.*'symmetric', 'pair'"):
        from_dict({**BASE, "partition": {"label_noise_rule": "flip"}})

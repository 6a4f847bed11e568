"""What a new user meets with their own data: the config's partition fields do
not split data given with its own split, and the run says so at start (data
the config loaded and handed back, as a sweep does, is not noted); a built-in
model given rows of another shape is refused naming both shapes, not by
torch's words from the first matrix product."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedforge as ff
from fedforge.core.errors import DataError
from fedforge.data import dirichlet, from_tensors

BASE = {"model": "logreg", "num_clients": 4, "rounds": 1, "target_accuracy": None}


def _own(features: int = 60) -> ff.FederatedData:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, features, generator=gen), torch.randint(0, 10, (100,), generator=gen)
    return from_tensors(x[:80], y[:80], x[80:], y[80:], torch.arange(80) % 4, num_classes=10)


def test_partition_fields_on_own_data_are_said_to_be_ignored() -> None:
    cfg = ff.override(ff.Config(), {**BASE, "partition.kind": "dirichlet", "partition.alpha": 0.1})
    note = ff.build(cfg, _own()).note or ""
    fields = "partition.kind = 'dirichlet', partition.alpha = 0.1"
    assert f"{fields} ignored: the data came with its own split over clients" in note
    assert "fedforge.data.dirichlet" in note
    assert "partition" not in (ff.build(ff.override(ff.Config(), BASE), _own()).note or "")
    # the config's own data set, loaded and handed back: split by those fields, no note
    syn = ff.override(cfg, {"dataset": "synthetic"})
    assert "partition" not in (ff.build(syn, ff.load_federated_data(syn)).note or "")


def test_the_readme_dirichlet_split_is_a_label_skewed_partition() -> None:
    data = _own()
    labels = data.train_y.numpy()
    part = dirichlet(labels, 4, alpha=0.5, rng=np.random.default_rng(0))
    mine = from_tensors(data.train_x, data.train_y, data.test_x, data.test_y, part, num_classes=10)
    got = sorted(np.concatenate(mine.partition.client_indices).tolist())
    assert got == list(range(80))  # every row once, over the 4 clients
    assert ff.run(ff.override(ff.Config(), BASE), data=mine, store=False).rounds


@pytest.mark.parametrize("model", ["2nn", "cnn", "cnn_bn"])
def test_an_image_model_on_other_rows_names_both_shapes(model: str) -> None:
    cfg = ff.override(ff.Config(), {**BASE, "model": model})
    with pytest.raises(DataError) as refused:
        ff.build(cfg, _own(60))
    assert str(refused.value) == (
        f"train_x rows of shape (60,) do not fit model '{model}': it takes rows of shape "
        "(1, 28, 28) (28x28 images); use 'logreg' (sized by the inputs) or a model of your "
        "own (fedforge.register_model)"
    )

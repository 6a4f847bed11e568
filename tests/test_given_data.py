"""Data handed to run(cfg, data=...) that the run cannot train on is refused in
one line naming what is wrong, not by a shape or dtype error in round 1."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
import torch

import fedforge as ff
from fedforge.core.errors import DataError

GEN = torch.Generator().manual_seed(0)
X, Y = torch.randn(600, 1, 28, 28, generator=GEN), torch.randint(0, 10, (600,), generator=GEN)
CLIENTS = ff.Partition(tuple(torch.arange(500).reshape(5, 100).numpy()))


def _data(
    x: torch.Tensor = X, y: torch.Tensor = Y, clients: ff.Partition = CLIENTS
) -> ff.FederatedData:
    return ff.FederatedData(x[:500], y[:500], x[500:], y[500:], clients)


CASES: dict[str, tuple[Callable[[], ff.FederatedData], str]] = {
    "float64 features": (lambda: _data(x=X.double()), "train_x is torch.float64"),
    "float labels": (
        lambda: _data(y=Y.float()),
        "needs int64 class ids in train_y, got torch.float32",
    ),
    "fewer clients": (
        lambda: _data(clients=ff.Partition(CLIENTS.client_indices[:4])),
        "the partition has 4 clients; the config's num_clients is 5",
    ),
    "rows out of range": (
        lambda: ff.FederatedData(X[:400], Y[:400], X[500:], Y[500:], CLIENTS),
        "client 4's indices leave 0..399",
    ),
    "wrong image size": (
        lambda: _data(x=X[:, :, :14]),
        "train_x rows of shape (1, 14, 28) do not fit model '2nn'",
    ),
    "numpy features": (
        lambda: ff.FederatedData(X.numpy()[:500], Y[:500], X[500:], Y[500:], CLIENTS),  # type: ignore[arg-type]
        "train_x and train_y must be torch tensors",
    ),
    "bfloat16 features": (lambda: _data(x=X.bfloat16()), "train_x is torch.bfloat16"),
    "flat features": (
        lambda: _data(x=X.reshape(600, 784)),
        "train_x rows of shape (784,) do not fit model '2nn'",
    ),
    "unbatched-looking images": (  # one row of (28, 28) passed for a whole image
        lambda: _data(x=X.reshape(600, 28, 28)),
        "train_x rows of shape (28, 28) do not fit model '2nn'",
    ),
    "test labels out of range": (
        lambda: ff.FederatedData(X[:500], Y[:500], X[500:], Y[500:] - 1, CLIENTS),
        "test_y holds class -1 (row 2); allowed: 0..9",
    ),
    "a client without examples": (
        lambda: _data(
            clients=ff.Partition((*CLIENTS.client_indices[:4], CLIENTS.client_indices[4][:0]))
        ),
        "client 4 has no examples",
    ),
    "overlapping clients": (  # row 150 given to clients 1 and 3
        lambda: _data(
            clients=ff.Partition(
                (
                    *CLIENTS.client_indices[:3],
                    np.append(CLIENTS.client_indices[3], 150),
                    CLIENTS.client_indices[4],
                )
            )
        ),
        "row 150 of train_x is in clients 1 and 3 (rows held more than once: 1)",
    ),
    "a row twice in one client": (
        lambda: _data(
            clients=ff.Partition(
                (*CLIENTS.client_indices[:4], np.append(CLIENTS.client_indices[4], [401, 402]))
            )
        ),
        "row 401 of train_x is in client 4, twice (rows held more than once: 2)",
    ),
    "no test set": (
        lambda: ff.FederatedData(X[:500], Y[:500], X[:0], Y[:0], CLIENTS),
        "the test set is empty",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_unusable_data_is_refused_before_training(case: str) -> None:
    make, why = CASES[case]
    cfg = ff.override(ff.Config(), {"model": "2nn", "num_clients": 5, "rounds": 1})
    with pytest.raises(DataError, match=re.escape(why)):
        ff.build(cfg, make())
    assert ff.build(cfg, _data()).spec.size == 199_210  # the right data builds


def test_partition_indices_must_be_integers() -> None:
    """A boolean mask was cast to indices 0 and 1 (every client then trained on
    rows 0 and 1 with num_examples 500), floats truncated, strings parsed."""
    from fedforge.core.errors import PartitionError

    mask = np.zeros(500, dtype=bool)
    mask[100:200] = True
    for bad, kind in ((mask, "bool"), (np.array([3.9, 7.5]), "float64"), (np.array(["12"]), "<U2")):
        with pytest.raises(PartitionError, match=f"client 1's indices are {re.escape(kind)}"):
            ff.Partition((np.arange(3), bad))
    ok = ff.Partition((np.arange(3), np.flatnonzero(mask), np.array([], dtype=np.int64)))
    assert ok.sizes().tolist() == [3, 100, 0]
    assert ff.Partition(([1, 2], [])).sizes().tolist() == [2, 0]  # plain lists, an empty one

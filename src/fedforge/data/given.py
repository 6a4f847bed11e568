"""Checks of a data set a caller hands to ``run(cfg, data=...)`` (one loaded from
the config is right by construction), before anything reads it: what is wrong
is said in one line, naming the tensor and what the config and model need,
instead of a shape, type or index error from deep inside the first round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedforge.core.errors import DataError

if TYPE_CHECKING:
    from fedforge.data.federated import FederatedData


def check_given(
    data: FederatedData,
    num_clients: int,
    dtype: torch.dtype,
    model: nn.Module,
    name: str,
    num_classes: int,
) -> None:
    """Refuse ``data`` that the run of ``num_clients`` clients in ``dtype`` on
    ``model`` (the config's ``name``, ``num_classes`` outputs) cannot train on."""
    for what, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise DataError(f"{what}_x and {what}_y must be torch tensors")
        if x.dtype != dtype:
            raise DataError(f"{what}_x is {x.dtype}; the config's dtype needs {dtype}")
        if y.dtype != torch.int64 or y.dim() != 1 or len(y) != len(x):
            raise DataError(
                f"{what}_y must be int64 class ids, one per row of {what}_x ({len(x)}); got "
                f"{y.dtype} of shape {tuple(y.shape)}"
            )
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            raise DataError(
                f"{what}_y holds classes {int(y.min())}..{int(y.max())}; allowed: "
                f"0..{num_classes - 1}"
            )
    if len(data.test_y) == 0:
        raise DataError("the test set is empty: the run evaluates on it")
    got = data.partition.num_clients
    if got != num_clients:
        raise DataError(
            f"the partition has {got} clients; the config's num_clients is {num_clients}"
        )
    rows = len(data.train_y)
    for k, idx in enumerate(data.partition.client_indices):
        if np.ndim(idx) != 1:
            raise DataError(f"client {k}'s indices have shape {np.shape(idx)}; one row each (1-D)")
        if len(idx) == 0:
            raise DataError(f"client {k} has no examples: every client needs at least one")
        if int(np.min(idx)) < 0 or int(np.max(idx)) >= rows:
            raise DataError(f"client {k}'s indices leave 0..{rows - 1}, the rows of train_x")
    _check_disjoint(data.partition.client_indices, rows)
    check_fits(data, model, name, num_classes)


def _check_disjoint(client_indices: Sequence[np.ndarray], rows: int) -> None:
    """Each row of train_x belongs to one client at most, once: a row held twice
    is trained on twice a round, and under DP one person's example in two
    clients' updates is outside what the accountant bounds."""
    counts = np.bincount(
        np.concatenate([np.asarray(i, dtype=np.int64) for i in client_indices]), minlength=rows
    )
    if counts.max(initial=0) <= 1:
        return
    row = int(np.argmax(counts > 1))
    holders = [k for k, idx in enumerate(client_indices) if np.any(np.asarray(idx) == row)]
    where = (
        f"clients {holders[0]} and {holders[1]}"
        if len(holders) > 1
        else f"client {holders[0]}, twice"
    )
    shared = int((counts > 1).sum())
    raise DataError(
        f"row {row} of train_x is in {where} (rows held more than once: {shared}): "
        "clients' data must not overlap; give each row to one client"
    )


def check_fits(data: FederatedData, model: nn.Module, name: str, num_classes: int) -> None:
    """Refuse features that ``model`` cannot take (also a registered model's on a
    data set the config loads)."""
    for what, x in (("train_x", data.train_x), ("test_x", data.test_x)):
        _fits(model, x[:2], what, name, num_classes)


def _fits(model: nn.Module, x: torch.Tensor, what: str, name: str, num_classes: int) -> None:
    """Two rows (a batch of one may pass for an unbatched sample) through the model."""
    shape = tuple(x.shape[1:])
    try:
        with torch.no_grad():
            out = model.eval()(x)
    except Exception as exc:  # a caller's model may raise anything on a bad shape
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(
            f"{what} rows of shape {shape} do not fit model '{name}': {first}"
        ) from None
    if not isinstance(out, torch.Tensor):
        raise DataError(f"model '{name}' returns {type(out).__name__}; it must return logits")
    if tuple(out.shape) != (len(x), num_classes):
        raise DataError(
            f"{what} rows of shape {shape} give model '{name}' outputs of shape "
            f"{tuple(out.shape)}; expected ({len(x)}, {num_classes})"
        )

"""Checks of a data set a caller hands to ``run(cfg, data=...)`` (one loaded from
the config is right by construction), before anything reads it: what is wrong
is said in one line, naming the tensor and what the config and model need,
instead of a shape, type or index error from deep inside the first round."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedforge.core.errors import DataError

if TYPE_CHECKING:
    from fedforge.data.federated import FederatedData


def check_given(
    data: FederatedData, num_clients: int, dtype: torch.dtype, model: nn.Module, name: str
) -> None:
    """Refuse ``data`` that the run of ``num_clients`` clients in ``dtype`` on
    ``model`` (called ``name``) cannot train on. Labels are class ids (int64, one a
    row or one a step, in ``0..num_classes - 1``; -1 marks a sequence's padding) or
    float regression targets; float inputs are in the run's dtype, integer inputs
    (token ids) stay integers. Data that holds only some clients' rows
    (``data.hosted``: a deployment's) needs rows for those alone, and a test set
    only when it holds none (the server's: it evaluates on it)."""
    classes = data.classes()
    for what, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise DataError(f"{what}_x and {what}_y must be torch tensors")
        if x.is_floating_point() and x.dtype != dtype:
            raise DataError(f"{what}_x is {x.dtype}; the config's dtype needs {dtype}")
        if y.dim() < 1 or len(y) != len(x):
            raise DataError(
                f"{what}_y must hold one label (or label row) a row of {what}_x ({len(x)}); "
                f"got shape {tuple(y.shape)}"
            )
        if y.is_floating_point():
            if y.dtype != dtype:
                raise DataError(f"{what}_y targets are {y.dtype}; the config's dtype needs {dtype}")
            continue
        if y.dtype != torch.int64:
            raise DataError(f"{what}_y must be int64 class ids or float targets; got {y.dtype}")
        check_classes(what + "_y", y, classes)
    hosted = data.hosted
    if len(data.test_y) == 0 and not hosted:
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
        if len(idx) == 0 and hosted is not None and k not in hosted:
            continue  # held elsewhere
        if len(idx) == 0:
            raise DataError(f"client {k} has no examples: every client needs at least one")
        if int(np.min(idx)) < 0 or int(np.max(idx)) >= rows:
            raise DataError(f"client {k}'s indices leave 0..{rows - 1}, the rows of train_x")
    _check_disjoint(data.partition.client_indices, rows)
    check_fits(data, model, name)


def check_classes(what: str, y: torch.Tensor | np.ndarray, classes: int | None) -> None:
    """Class ids in ``0..classes - 1`` (-1, padding, allowed in sequences);
    ``what`` names the labels in the error. ``y`` a tensor, or an array of any
    integer dtype (checked before a cast to int64 could wrap a uint64 around)."""
    if classes is None:
        return
    a = y if isinstance(y, np.ndarray) else y.detach().cpu().numpy()
    if not a.size:
        return
    low = -1 if a.ndim > 1 else 0
    lo, hi = int(a.min()), int(a.max())
    if lo < low or hi >= classes:
        bad = lo if lo < low else hi
        row = int(np.argwhere(a == bad)[0, 0])
        raise DataError(
            f"{what} holds class {bad} (row {row}); allowed: 0..{classes - 1}"
            + (" and -1 (padding)" if low < 0 else "")
        )


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


def check_fits(data: FederatedData, model: nn.Module, name: str) -> None:
    """Refuse features that ``model`` cannot take and outputs that do not fit the
    labels (also a registered model's on a data set the config loads)."""
    classes = data.classes()
    for what, x, y in (
        ("train_x", data.train_x, data.train_y),
        ("test_x", data.test_x, data.test_y),
    ):
        if not len(x):  # a client process's absent test set
            continue
        rows = min(2, len(x))
        want = (rows, *y.shape[1:], classes) if classes is not None else (rows, *y.shape[1:])
        _fits(model, x[:2], what, name, want, classes is None)


def _fits(
    model: nn.Module, x: torch.Tensor, what: str, name: str, want: tuple[int, ...], values: bool
) -> None:
    """Two rows (a batch of one may pass for an unbatched sample) through the model;
    its outputs must be ``want`` (``values``: regression, any shape of as many)."""
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
    fits = tuple(out.shape) == want or (values and out.numel() == math.prod(want))
    if not fits:
        raise DataError(
            f"{what} rows of shape {shape} give model '{name}' outputs of shape "
            f"{tuple(out.shape)}; expected {want}"
        )

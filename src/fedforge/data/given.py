"""Checks of a data set a caller hands to ``run(cfg, data=...)`` (one loaded from
the config is right by construction): what is wrong is said in one line, naming
the tensor and what the config and model need, instead of a shape or dtype
error from deep inside the first round."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedforge.errors import DataError

if TYPE_CHECKING:
    from fedforge.experiment import FederatedData


def check_given(
    data: FederatedData, num_clients: int, dtype: torch.dtype, model: nn.Module, name: str
) -> None:
    """Refuse ``data`` that the run of ``num_clients`` clients in ``dtype`` on
    ``model`` (the config's ``name``) cannot train on; returns when it can."""
    for what, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
        if x.dtype != dtype:
            raise DataError(f"{what}_x is {x.dtype}; the config's dtype needs {dtype}")
        if y.dtype != torch.int64 or y.dim() != 1 or len(y) != len(x):
            raise DataError(
                f"{what}_y must be int64 class ids, one per row of {what}_x ({len(x)}); got "
                f"{y.dtype} of shape {tuple(y.shape)}"
            )
    got = data.partition.num_clients
    if got != num_clients:
        raise DataError(
            f"the partition has {got} clients; the config's num_clients is {num_clients}"
        )
    rows = len(data.train_y)
    for k, idx in enumerate(data.partition.client_indices):
        if len(idx) and (int(np.min(idx)) < 0 or int(np.max(idx)) >= rows):
            raise DataError(f"client {k}'s indices leave 0..{rows - 1}, the rows of train_x")
    if len(data.test_x):
        try:
            with torch.no_grad():
                model.eval()(data.test_x[:1])
        except RuntimeError as exc:
            shape = tuple(data.test_x.shape[1:])
            first = str(exc).splitlines()[0]
            raise DataError(
                f"features of shape {shape} do not fit model '{name}': {first}"
            ) from None

"""Parameter subsets kept on the clients, with any algorithm.

``local_params`` (config/local.py) names entries of the flat vector by kind
(``weight``, ``batchnorm``, ``buffer``: core/params.py) or by a regular
expression on the tensor's name; each client keeps its own values of them
between rounds and never uploads them (the update carries the shared entries
alone: communication/shared.py), and the server never moves them in the
global vector. It is FedBN's mechanism (Li et al. 2021:
:class:`~fedforge.algorithms.fedbn.LocalBatchNorm`, the same per-client table)
put over another algorithm's bundle: FedProx or SCAFFOLD with local batch norm
is ``algorithm: fedprox`` (or ``scaffold``) with ``local_params.kinds:
[batchnorm, buffer]``, and ``algorithm: fedbn`` stays the spelling of FedAvg
with local batch norm. ``kinds: [weight]`` shares only the normalisation layers.

Under SCAFFOLD the model's local entries never leave the client; its control
variates still cover every entry (c_k is computed from the client's own start).
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

import torch

from fedforge.algorithms.base import Algorithm
from fedforge.algorithms.fedbn import LocalBatchNorm
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamKind, ParamSpec
from fedforge.store.client_state import make_state_store, working_dir

if TYPE_CHECKING:
    from fedforge.config import Config


def subset_mask(spec: ParamSpec, kinds: tuple[ParamKind, ...], names: str | None) -> torch.Tensor:
    """The ``[P]`` mask of the entries whose kind is in ``kinds`` or whose name
    ``names`` (a regular expression) matches somewhere."""
    mask = spec.mask(kinds)
    if names is not None:
        pattern = re.compile(names)
        for e in spec.entries:
            if pattern.search(e.name):
                mask[e.slice] = True
    return mask


def with_local_params(
    cfg: Config, spec: ParamSpec | None, dtype: torch.dtype | None, algorithm: Algorithm
) -> Algorithm:
    """``algorithm`` with the entries ``cfg.local_params`` selects kept per client
    (unchanged when it selects none)."""
    sel = cfg.local_params
    if not sel.any:
        return algorithm
    if spec is None or dtype is None:
        raise ValueError("local_params needs the model's spec and dtype for its table")
    if algorithm.personal is not None:
        raise ConfigError(
            f"local_params with algorithm {cfg.algorithm!r}, which keeps its own entries "
            "on the clients already; allowed: an algorithm without them (e.g. fedavg, "
            "fedprox, scaffold)"
        )
    if algorithm.local_train is not None:
        raise ConfigError(
            f"local_params with algorithm {cfg.algorithm!r}, which runs its own local loop; "
            "allowed: an algorithm on local SGD (e.g. fedavg, fedprox, scaffold)"
        )
    mask = subset_mask(spec, sel.kinds, sel.names)
    shown = f"kinds {list(sel.kinds)}, names {sel.names!r}"
    if not bool(mask.any()):
        raise ConfigError(
            f"local_params ({shown}) selects no entry of model {cfg.model!r}; its tensors: "
            + ", ".join(f"{e.name} ({e.kind})" for e in spec.entries)
        )
    trainable_shared = [e for e in spec.entries if e.trainable and not bool(mask[e.slice].all())]
    if not trainable_shared:
        raise ConfigError(
            f"local_params ({shown}) keeps every trained entry of model {cfg.model!r} "
            "local: nothing would be shared; allowed: a part of the model"
        )
    where = working_dir("local_params")
    store = make_state_store(cfg.num_clients, int(mask.sum()), dtype, where, remove_dir=True)
    return dataclasses.replace(algorithm, personal=LocalBatchNorm(mask, store))

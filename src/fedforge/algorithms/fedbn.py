"""FedBN: Li et al. 2021, "FedBN: Federated Learning on Non-IID Features via
Local Batch Normalization" (ICLR), Algorithm 1.

FedAvg, except that every batch-norm tensor (the affine weight and bias, and
the running mean and variance) stays with its client and is never averaged.

Decisions (this code, not the paper):

- The payload still carries the whole global vector; its batch-norm entries
  are the initial values and never change: they are what a client seen for the
  first time starts from. A client seen before overwrites them with its own
  (``start``) before training.
- A client keeps its batch-norm entries after training (``keep``) and leaves
  them out of its update: nothing about its normalisation leaves it.
- The server puts the batch-norm entries of the global vector back after every
  step (``round.py``), so no aggregate stage (central DP noise) and no server
  optimizer can move them, whatever the clients send.

Runs on the clients (FedAvg's local training from their own batch norm) and on
the server (the FedAvg mean of the shared entries). The per-client batch-norm
values are a :class:`~fedforge.store.ClientStateStore` of the local entries only
(table ``batchnorm``, saved by checkpoints). Batch-norm running statistics are
buffers updated in place, so FedBN runs on the serial engine (the vectorised
one falls back with its one-line reason). Trusts what FedAvg trusts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from fedforge.algorithms.base import Algorithm, cross_entropy
from fedforge.algorithms.plan import DecayedPlan, LocalPlan
from fedforge.core.errors import StoreError
from fedforge.core.params import ParamKind, ParamSpec, all_finite
from fedforge.store.client_state import ClientStateStore
from fedforge.store.final import load_final

BATCHNORM = "batchnorm"  # the per-client table's name
SHARED: tuple[ParamKind, ...] = ("weight",)  # FedBN averages only the non-normalisation weights


def local_mask(spec: ParamSpec) -> torch.Tensor:
    """The ``[P]`` mask of the entries FedBN keeps local: batch-norm parameters and
    running statistics (every entry that is not a plain weight)."""
    return ~spec.mask(SHARED)


class LocalBatchNorm:
    """Each client's own batch-norm entries, kept between rounds in ``store``
    (``[N, L]``, L = the number of local entries)."""

    def __init__(self, mask: torch.Tensor, store: ClientStateStore) -> None:
        if int(mask.sum()) != store.size:
            raise ValueError(f"store rows of {store.size} for {int(mask.sum())} local entries")
        self.mask = mask
        self.store = store
        self.tables = {BATCHNORM: store}

    def start(self, client_id: int, params: torch.Tensor) -> torch.Tensor:
        """The client's starting point: the global vector with its own batch-norm
        entries, or the global ones for a client seen for the first time."""
        if not self.store.has(client_id):
            return params
        out = params.clone()
        out[self.mask] = self.store.gather([client_id])[0].to(params.dtype)
        return out

    def keep(self, client_id: int, params: torch.Tensor) -> None:
        """Store the client's batch-norm entries after training, unless training
        diverged (a non-finite entry): the client then keeps what it had, as the
        server keeps the global model when it refuses the update."""
        entries = params[self.mask]
        if all_finite(entries):
            self.store.scatter([client_id], entries.unsqueeze(0))

    def final(self) -> dict[str, torch.Tensor]:
        """Every client's entries as saved with a finished run (the final parameters'
        ``personal``): the local mask, the ids of the clients seen, their rows."""
        ids = self.store.written()
        rows = self.store.gather(ids) if ids else torch.empty(0, self.store.size)
        return {"mask": self.mask, "client_ids": torch.tensor(ids, dtype=torch.int64), "rows": rows}


def client_params(final: Mapping[str, object] | Path | str, client_id: int) -> torch.Tensor:
    """A client's own model from a finished FedBN run's final parameters (its run
    directory, verified by :func:`~fedforge.store.final.load_final`, or what that
    returned): the global vector with the client's batch-norm entries, or the
    global ones for a client never sampled."""
    if isinstance(final, Path | str):
        final = load_final(final)
    params, personal = final["params"], final.get("personal")
    if not isinstance(personal, dict):
        raise StoreError("the final parameters hold no per-client entries: not a FedBN run")
    assert isinstance(params, torch.Tensor) and isinstance(personal, dict)
    out = params.clone()
    hits = (personal["client_ids"] == client_id).nonzero().flatten()
    if len(hits):
        out[personal["mask"]] = personal["rows"][int(hits[0])].to(out.dtype)
    return out


def fedbn(
    plan: LocalPlan,
    mask: torch.Tensor,
    store: ClientStateStore,
    lr_decay: float = 1.0,
    drop_stragglers: bool = True,
) -> Algorithm:
    """FedBN: FedAvg (local ``plan``, its lr decayed by ``lr_decay`` a round) on the
    entries outside ``mask``; the entries in ``mask`` are kept per client in ``store``."""
    return Algorithm(
        "fedbn",
        DecayedPlan(plan, lr_decay),
        cross_entropy,
        shared_kinds=SHARED,
        personal=LocalBatchNorm(mask, store),
        drop_stragglers=drop_stragglers,
    )

"""A finished run's final model audited for membership leakage (the
loss-threshold attack of ``fedforge.evaluation.membership``): members are rows
of the run's clients' training data, non-members rows of its test split (held
out, the same distribution), equal numbers of each drawn from the seed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from fedforge.evaluation.membership import MembershipAudit, audit_model, balanced_rows
from fedforge.server.experiment import build
from fedforge.store.final import load_final
from fedforge.store.runstore import RunStore


def audit_run(run_dir: Path | str, examples: int | None = 10_000, seed: int = 0) -> MembershipAudit:
    """The attack on the final parameters of the run in ``run_dir``: its data
    loaded again from its config, ``examples`` members and as many non-members
    (None: as many as the smaller pool holds)."""
    with RunStore.open(run_dir, read_only=True) as store:
        cfg = store.config()
    params = load_final(run_dir)["params"]
    exp = build(dataclasses.replace(cfg, engine="serial"))  # the model and data only
    data = exp.data
    rows = np.unique(np.concatenate([np.asarray(ix) for ix in data.partition.client_indices]))
    mem, non = balanced_rows(rows, np.arange(len(data.test_y)), examples, seed)
    return audit_model(
        exp.model,
        exp.spec,
        params.to(exp.initial_params.dtype),
        (data.train_x[mem], data.train_y[mem]),
        (data.test_x[non], data.test_y[non]),
        exp.algorithm.loss_fn,
    )


__all__ = ["audit_run"]

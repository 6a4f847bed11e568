"""Clients never seen in training, under a model with batch norm (FedBN's
generalisation question, Li et al. 2021): such a client has no batch-norm
entries of its own. It can use the global ones, or recompute the running
statistics on its own data: one forward pass in train mode over its examples,
no gradient step, the statistics the exact mean and (unbiased) variance over
its batches (``momentum=None``: torch's cumulative average), the affine
parameters left as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from fedforge.core.params import ParamSpec


def recomputed_statistics(
    model: nn.Module, spec: ParamSpec, params: torch.Tensor, x: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """``params`` with every batch norm's running mean and variance recomputed on
    ``x`` (forward passes in train mode, no gradient); ``model`` is left as it was."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    momenta = [m.momentum for m in norms]
    was_training = model.training
    try:
        spec.load_into(model, params)
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # the cumulative average: every batch counts alike
        model.train()
        with torch.no_grad():
            for i in range(0, len(x), batch_size):
                model(x[i : i + batch_size])
        return spec.flatten(model, params.dtype)
    finally:
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
        model.load_state_dict(saved)
        model.train(was_training)

"""The client's held-out-loss gate before it uploads.

``ClientGate`` (client; trusts its own data only): a
slice of each client's data (``holdout_fraction``, at least one example, drawn
from (seed, "holdout", client)) is kept out of training; after local training
the client compares the loss on it of the new local model with that of the
global model, and withholds its update, saying why, when the loss went up.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import functional_call

from fedforge.algorithms.plan import LossFn
from fedforge.core.device import module_device
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.core.rng import torch_generator
from fedforge.data.federated import ClientDataFn


class ClientGate:
    """Splits each client's data into training and held-out parts, and judges a
    local model on the held-out part."""

    def __init__(
        self,
        data_fn: ClientDataFn,
        holdout_fraction: float,
        seed: int,
        exempt: frozenset[int] = frozenset(),
    ) -> None:
        if not 0.0 < holdout_fraction < 1.0:
            raise ConfigError(
                f"holdout_fraction {holdout_fraction!r} is invalid: must be in (0, 1)"
            )
        self.data_fn, self.fraction, self.seed = data_fn, holdout_fraction, seed
        self.exempt = exempt  # simulated attackers: they skip the check

    def _split(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        x, y = self.data_fn(client_id)
        n = len(y)
        held = min(max(1, math.floor(self.fraction * n + 1e-9)), n - 1) if n >= 2 else 0
        perm = torch.randperm(n, generator=torch_generator(self.seed, "holdout", client_id))
        return x[perm], y[perm], held

    def train_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What the client trains on: its data without the held-out slice."""
        x, y, held = self._split(client_id)
        return x[held:], y[held:]

    def holdout(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, held = self._split(client_id)
        return x[:held], y[:held]

    def check(
        self,
        model: nn.Module,
        spec: ParamSpec,
        loss_fn: LossFn,
        client_id: int,
        start: torch.Tensor,
        local: torch.Tensor,
    ) -> str | None:
        """Why the update of ``local`` (trained from ``start``) must be withheld, or
        None when its held-out loss is not higher than the global model's."""
        x, y = self.holdout(client_id)
        if len(y) == 0 or client_id in self.exempt:
            return None  # a single example holds nothing out; an attacker sends anyway
        device = module_device(model)  # both losses on the model's device
        x, y, start, local = x.to(device), y.to(device), start.to(device), local.to(device)
        model.eval()
        with torch.no_grad():
            before = float(loss_fn(functional_call(model, spec.views(start), (x,)), y).mean())
            after = float(loss_fn(functional_call(model, spec.views(local), (x,)), y).mean())
        if math.isnan(after) or after > before:
            return (
                f"held-out loss rose from {before:.6g} to {after:.6g} on {len(y)} held-out examples"
            )
        return None

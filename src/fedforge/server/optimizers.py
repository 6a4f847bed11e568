"""Server optimizers (Reddi et al. 2021, "Adaptive Federated Optimization"): the
server treats minus the aggregated delta as a pseudo-gradient. SGD with lr 1 and
no momentum is exactly FedAvg's "replace by the average". Runs on the server."""

from __future__ import annotations

from typing import Protocol

import torch


class ServerOptimizer(Protocol):
    """Applies an aggregated delta to the global parameters; owns its state."""

    def step(self, params: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


class ServerSGD:
    """x <- x - lr * g with g = -aggregate (optionally with heavy-ball momentum)."""

    def __init__(self, lr: float = 1.0, momentum: float = 0.0) -> None:
        if lr <= 0:
            raise ValueError(f"server lr {lr} must be > 0")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"server momentum {momentum} must be in [0, 1)")
        self.lr = lr
        self.momentum = momentum
        self._velocity: torch.Tensor | None = None

    def step(self, params: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor:
        pseudo_grad = -aggregate
        if self.momentum:
            if self._velocity is None:
                self._velocity = torch.zeros_like(params)
            self._velocity.mul_(self.momentum).add_(pseudo_grad)
            pseudo_grad = self._velocity
        return params - self.lr * pseudo_grad

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self._velocity is None else {"velocity": self._velocity.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        velocity = state.get("velocity")
        self._velocity = None if velocity is None else velocity.clone()

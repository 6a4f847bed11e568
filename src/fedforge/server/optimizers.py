"""Server optimizers (Reddi et al. 2021, "Adaptive Federated Optimization",
Algorithms 1 and 2). The server treats minus the aggregated delta as a
pseudo-gradient. SGD with lr 1 and no momentum is exactly FedAvg's "replace by
the average"; with momentum it is FedAvgM (Hsu et al. 2019). FedAdagrad,
FedAdam and FedYogi keep first and second moments of the aggregated delta:

    m_t = b1 m_{t-1} + (1 - b1) D_t
    v_t = v_{t-1} + D_t^2                                   (Adagrad)
    v_t = b2 v_{t-1} + (1 - b2) D_t^2                       (Adam)
    v_t = v_{t-1} - (1 - b2) D_t^2 sign(v_{t-1} - D_t^2)    (Yogi)
    x_{t+1} = x_t + lr m_t / (sqrt(v_t) + tau)

with v_{-1} = tau^2 as in the paper. ``bias_correction=True`` starts v at 0 and
divides m by (1 - b1^t) and, for Adam and Yogi, v by (1 - b2^t), which is
torch.optim.Adam's update (Adagrad's v is a plain sum: not divided). Runs on
the server; trusts the aggregate it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol, cast

import torch

from fedforge.config import Config
from fedforge.config.components import make
from fedforge.core import registry

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext


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


AdaptiveKind = Literal["adagrad", "adam", "yogi"]


class ServerAdaptive:
    """FedAdagrad, FedAdam or FedYogi (Reddi et al. 2021, Algorithm 2)."""

    def __init__(
        self,
        kind: AdaptiveKind,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        bias_correction: bool = False,
    ) -> None:
        if kind not in ("adagrad", "adam", "yogi"):
            raise ValueError(f"adaptive server optimizer {kind!r}: use adagrad, adam or yogi")
        if lr <= 0 or tau <= 0 or not (0 <= beta1 < 1) or not (0 <= beta2 < 1):
            raise ValueError(
                f"need lr > 0, tau > 0, beta1 and beta2 in [0, 1); got lr={lr} tau={tau} "
                f"beta1={beta1} beta2={beta2}"
            )
        self.kind = kind
        self.lr, self.beta1, self.beta2, self.tau = lr, beta1, beta2, tau
        self.bias_correction = bias_correction
        self._m: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._t = 0

    def step(self, params: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor:
        d = aggregate.to(params.dtype)
        if self._m is None or self._v is None:
            self._m = torch.zeros_like(params)
            v0 = 0.0 if self.bias_correction else self.tau**2
            self._v = torch.full_like(params, v0)
        m, v = self._m, self._v
        self._t += 1
        m.mul_(self.beta1).add_(d, alpha=1 - self.beta1)
        d2 = d * d
        if self.kind == "adagrad":
            v.add_(d2)
        elif self.kind == "adam":
            v.mul_(self.beta2).add_(d2, alpha=1 - self.beta2)
        else:
            v.sub_((1 - self.beta2) * d2 * torch.sign(v - d2))
        m_hat, v_hat = m, v
        if self.bias_correction:
            m_hat = m / (1 - self.beta1**self._t)
            if self.kind != "adagrad":  # Adam and Yogi decay v by b2: from 0, biased
                v_hat = v / (1 - self.beta2**self._t)
        return params + self.lr * m_hat / (v_hat.sqrt() + self.tau)

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self._m is None or self._v is None:
            return {}
        return {"m": self._m.clone(), "v": self._v.clone(), "t": torch.tensor(self._t)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state:
            self._m = self._v = None
            self._t = 0
            return
        self._m, self._v = state["m"].clone(), state["v"].clone()
        self._t = int(state["t"])


class ServerOptimizerFactory(Protocol):
    """Builds the server optimizer a config names, once per run; its
    ``state_dict`` (tensors by name) is checkpointed with the run and given back
    to ``load_state_dict`` on resume, so a resumed run steps exactly as before."""

    def __call__(self, context: ComponentContext) -> ServerOptimizer: ...


def register_server_optimizer(
    name: str,
    factory: ServerOptimizerFactory | Callable[[ComponentContext], ServerOptimizer],
    *,
    options: type | None = None,
    replace: bool = False,
) -> None:
    """Register ``factory`` as the server optimizer ``name``
    (``server_optimizer.kind: NAME``); ``options`` as for every kind."""
    registry.register("server_optimizer", name, factory, options=options, replace=replace)


def sgd_factory(context: ComponentContext) -> ServerOptimizer:
    cfg = context.cfg
    return ServerSGD(cfg.server_optimizer.lr, cfg.server_optimizer.momentum)


def adaptive_factory(context: ComponentContext) -> ServerOptimizer:
    cfg, so = context.cfg, context.cfg.server_optimizer
    kind = cast(AdaptiveKind, context.name)
    return ServerAdaptive(
        kind, cfg.server_optimizer.lr, so.beta1, so.beta2, so.tau, so.bias_correction
    )


def from_config(cfg: Config) -> ServerOptimizer:
    """The server optimizer a config names (``server_optimizer.kind``), built by
    its registered factory."""
    optimizer: ServerOptimizer = make(
        "server_optimizer", cfg.server_optimizer.kind, cfg, "server_optimizer.kind"
    )
    return optimizer

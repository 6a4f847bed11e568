"""The local step both engines share, and the protocols through which an
algorithm reaches into local training (DESIGN idea 3).

One step, given the loss gradient g of a minibatch:

1. the algorithm's gradient hook adds its term (FedProx: mu (w - w_t);
   SCAFFOLD: c - c_k), giving the gradient of the local objective;
2. clipping: the whole gradient is scaled to L2 norm at most ``grad_clip``
   (per client, as ``torch.nn.utils.clip_grad_norm_``: coefficient
   ``grad_clip / (norm + 1e-6)`` clamped to 1);
3. weight decay and momentum exactly as ``torch.optim.SGD`` (dampening 0, no
   Nesterov): d = g + wd w; b = m b + d (b = d at the first step); d = b;
4. w <- w - lr d.

A hook may declare its term as linear in the parameters (:class:`LinearTerm`,
through ``linear_term``); a fast path then folds it into its own update (the
vectorised engine's perceptron path) and runs any other hook as it is.

Every tensor here carries a leading client dimension: ``[K, ...]`` per
parameter tensor in the vectorised engine, ``[1, ...]`` in the serial one
(views of the flat vectors), so both engines run this very code. In the
vectorised engine a client whose schedule has ended (padded steps) gets an
``active`` flag of False: its parameters and momentum stay untouched.
Runs on the client; trusts its own data and the payload.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn
from torch.func import functional_call

from fedforge.core.device import module_device

if TYPE_CHECKING:
    from fedforge.algorithms.plan import LocalPlan, LossFn
    from fedforge.core.params import ParamSpec
    from fedforge.store.client_state import ClientStateStore


@dataclass(frozen=True)
class LocalResult:
    """What local training produced: the new local parameters (flat), the mean
    training loss over the examples seen, and the number of SGD steps taken."""

    params: torch.Tensor
    train_loss: float
    steps: int


@dataclass
class StepContext:
    """What a gradient hook may read: per parameter tensor, the current local
    parameters ``[K, ...]``, the round's start parameters w_t ``[1 or K, ...]``
    and the per-client tensors an algorithm prepared before training
    (``state``, e.g. SCAFFOLD's c - c_k, ``[K, ...]``)."""

    params: list[torch.Tensor]
    anchor: list[torch.Tensor]
    state: dict[str, list[torch.Tensor]] = field(default_factory=dict)


class GradHook(Protocol):
    """Adds an algorithm's term to the loss gradients, in place."""

    def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None: ...


@dataclass(frozen=True)
class LinearTerm:
    """A gradient term linear in the parameters, declared so that a fast path
    can fold it into its own update instead of calling the hook:

        g <- g + proximal (w - w_t) + sum over (name, b) in ``state`` of b state[name]

    with w_t the round's start parameters and state[name] the algorithm's
    per-client tensor of that name (``StepContext.state``). Calling it adds the
    term through that formula (what a hook that declares it may do itself)."""

    proximal: float = 0.0
    state: Mapping[str, float] = field(default_factory=dict)

    def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        if self.proximal:
            diff = torch._foreach_sub(ctx.params, ctx.anchor)
            torch._foreach_add_(grads, diff, alpha=self.proximal)
        for name, coef in self.state.items():
            torch._foreach_add_(grads, ctx.state[name], alpha=coef)


class LinearGradHook(GradHook, Protocol):
    """A gradient hook whose term is a :class:`LinearTerm` (FedProx's proximal
    term, SCAFFOLD's correction). ``linear_term`` must describe exactly what
    ``__call__`` adds; a hook without it is run as it is, on the generic path."""

    def linear_term(self) -> LinearTerm: ...


def declared_linear_term(hook: GradHook | None) -> LinearTerm | None:
    """The linear term ``hook`` declares: the empty term for no hook, None for a
    hook that declares none (its term is known only by calling it)."""
    if hook is None:
        return LinearTerm()
    declare = getattr(hook, "linear_term", None)
    if declare is None:
        return None
    term = declare()
    if not isinstance(term, LinearTerm):
        raise TypeError(f"{type(hook).__name__}.linear_term() returned {term!r}, not a LinearTerm")
    return term


class LocalTrain(Protocol):
    """An algorithm's own local loop, run by ``ClientRuntime.run`` in place of
    :func:`fedforge.client.runtime.local_sgd` (Per-FedAvg's meta-steps): from ``start``, on
    the client's ``(x, y)``, drawing its batches from ``gen``."""

    def __call__(
        self,
        model: nn.Module,
        spec: ParamSpec,
        start: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        plan: LocalPlan,
        loss_fn: LossFn,
        gen: torch.Generator,
    ) -> LocalResult: ...


class ClientTerms(Protocol):
    """What an algorithm keeps per client and sends besides the delta.

    ``begin`` turns the payload's extra tensors and the clients' stored state
    into per-client ``[K, P]`` tensors for the hook; ``end`` runs after local
    training of one client, computes its new state and returns the extra
    tensors its update carries (named without the ``alg/`` wire prefix);
    ``commit`` stores the new state of the clients whose update the server used
    (the round's others keep theirs: the server never saw their change), and
    ``commit_used`` does the same while the others' new state stays pending (a
    deployment's client learns of each round's use separately). ``pending`` and
    ``restore_pending`` read and put back the state computed and not yet
    committed (a deployment's client keeps it on disk across a restart)."""

    @property
    def tables(self) -> Mapping[str, ClientStateStore]: ...  # saved by checkpoints

    def begin(
        self, client_ids: Sequence[int], start: torch.Tensor, extras: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]: ...

    def end(self, job: ClientJob) -> dict[str, torch.Tensor]: ...

    def commit(self, used: Collection[int]) -> None: ...

    def commit_used(self, used: Collection[int]) -> None: ...

    def pending(self) -> dict[int, torch.Tensor]: ...

    def restore_pending(self, pending: Mapping[int, torch.Tensor]) -> None: ...


class PersonalEntries(Protocol):
    """Entries of the flat vector each client keeps for itself and never shares
    (FedBN's batch norm). ``start`` puts the client's own values over the global
    vector (a client seen for the first time starts from the global ones), ``keep``
    stores them after training; the client's update leaves them out (the server
    reads zeros in their place: communication/shared.py) and the
    server never moves them in the global vector. ``final`` is what a finished run
    saves of them beside the global vector."""

    mask: torch.Tensor  # [P] bool: the personal entries
    tables: dict[str, ClientStateStore]  # its per-client tables, saved by checkpoints

    def start(self, client_id: int, params: torch.Tensor) -> torch.Tensor: ...

    def keep(self, client_id: int, params: torch.Tensor) -> None: ...

    def final(self) -> dict[str, torch.Tensor]: ...


class ServerTerms(Protocol):
    """The server half: its state (checkpointed), what the payload carries
    besides the parameters, what each update must carry, the tensors it takes
    from one update, and the state after a round from the tensors that reached
    the server with the used updates (a new dict: the round keeps it only when
    it is finite and the round stands).

    ``admit`` sees each update as it arrives (its delta as the server will
    average it, the tensors it carried, its example count as the header says
    and the server's caps allow): it returns the tensors the server keeps for
    the update, each checked against the delta and the count or recomputed
    from them where it can (a client may lie: a scalar it sends must not be
    able to scale the round's step), and raises ValueError with the reason to
    refuse the update."""

    update_tensors: tuple[str, ...]

    def initial_state(self, size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]: ...

    def payload(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def admit(
        self, delta: torch.Tensor, extras: Mapping[str, torch.Tensor], num_examples: int
    ) -> dict[str, torch.Tensor]: ...

    def moved(
        self,
        state: Mapping[str, torch.Tensor],
        extras: Sequence[Mapping[str, torch.Tensor]],
        num_clients: int,
    ) -> dict[str, torch.Tensor]: ...


class UpdateScale(Protocol):
    """The factor a client's delta (its local parameters minus the round's start)
    is multiplied by before the client's pipeline stages, from its local result
    (FedNova's 1 / a_i, a_i its number of local steps under plain SGD). Runs on
    the client, in every engine."""

    def __call__(self, result: LocalResult) -> float: ...


class ServerStep(Protocol):
    """The update the server optimizer applies (``w <- w + server_optimizer.lr * update``
    for plain SGD), and the algorithm's server state after the round, from the
    aggregate (the stages' output: the weighted mean of the deltas), the state
    ``ServerTerms.moved`` returned and the tensors each used update carried beside
    its delta (``ServerTerms.update_tensors``, one mapping an update, in no set
    order). FedNova scales the aggregate by tau_eff; FedDyn moves h by the
    aggregate and subtracts h / alpha; q-FedAvg's ``sum_k Delta_k / sum_k h_k`` is
    the mean of the Delta_k times K / sum_k h_k; FedExP extrapolates the mean by
    eta_g from the updates' squared norms. Returns new tensors; the round keeps
    them only when the step stands (a round skipped after it leaves nothing
    behind)."""

    def __call__(
        self,
        aggregate: torch.Tensor,
        state: Mapping[str, torch.Tensor],
        received: Sequence[Mapping[str, torch.Tensor]],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


@dataclass(frozen=True)
class ClientJob:
    """One client's finished local training, as ``ClientTerms.end`` sees it."""

    client_id: int
    start: torch.Tensor
    result: LocalResult
    x: torch.Tensor
    y: torch.Tensor
    lr: float
    extras: Mapping[str, torch.Tensor]
    grad_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LocalStep:
    """The update of one local step, for ``[K, ...]`` per-tensor parameter views
    written in place (see the module docstring for the order of the terms)."""

    def __init__(
        self,
        plan: LocalPlan,
        params: list[torch.Tensor],
        anchor: list[torch.Tensor],
        state: Mapping[str, list[torch.Tensor]] | None = None,
        hook: GradHook | None = None,
        lr: float | torch.Tensor | None = None,
    ) -> None:
        self.plan = plan
        self.lr = plan.lr if lr is None else lr  # one lr, or each client's [K]
        self.params = params
        self.hook = hook
        self.ctx = StepContext(params, anchor, dict(state or {}))
        self.buffers: list[torch.Tensor] | None = None
        self.started = False

    @torch.no_grad()
    def __call__(self, grads: list[torch.Tensor], active: torch.Tensor | None = None) -> None:
        plan = self.plan
        if self.hook is not None:
            self.hook(grads, self.ctx)
        if plan.grad_clip is not None:
            clip_by_norm_(grads, plan.grad_clip)
        if plan.weight_decay:
            torch._foreach_add_(grads, self.params, alpha=plan.weight_decay)
        direction = grads
        if plan.momentum:
            if self.buffers is None:
                self.buffers = [g.clone() for g in grads]  # torch.optim.SGD: b = d at first
                if active is not None:  # a client inactive at its first step keeps b = 0
                    self.buffers = [b * _expand(active, b) for b in self.buffers]
            else:
                new = list(torch._foreach_mul(self.buffers, plan.momentum))
                torch._foreach_add_(new, grads)
                if active is not None:
                    new = [
                        torch.where(_expand(active, b), n, b)
                        for n, b in zip(new, self.buffers, strict=True)
                    ]
                self.buffers = new
            direction = self.buffers
        if active is not None:
            direction = [d * _expand(active, d) for d in direction]
        sgd_step_(self.params, direction, self.lr)


def sgd_step_(
    params: list[torch.Tensor], direction: list[torch.Tensor], lr: float | torch.Tensor
) -> None:
    """p <- p - lr d for ``[K, ...]`` tensors, at one lr or at each client's (``[K]``)."""
    if isinstance(lr, torch.Tensor):
        for p, d in zip(params, direction, strict=True):
            p.sub_(d * _expand(lr, d))
    else:
        torch._foreach_add_(params, direction, alpha=-lr)


def _expand(active: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``active [K]`` shaped to broadcast against ``like [K, ...]``."""
    return active.view(-1, *([1] * (like.dim() - 1)))


def clip_by_norm_(grads: list[torch.Tensor], max_norm: float) -> None:
    """Scale each client's gradient (row k of every tensor) to L2 norm at most
    ``max_norm``, as ``torch.nn.utils.clip_grad_norm_`` does for one model."""
    per_tensor = torch.stack([g.flatten(1).norm(dim=1) for g in grads])  # [T, K]
    total = torch.linalg.vector_norm(per_tensor, dim=0)  # [K]
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(_expand(coef, g))


def full_gradient(
    model: nn.Module, spec: ParamSpec, loss_fn: LossFn
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(params, x, y) -> flat gradient`` of the mean loss over all of ``x`` (one
    full batch), e.g. SCAFFOLD's option I control ``c_k = grad f_k(x)``; computed
    on the model's device, returned on the device of ``params``."""

    def grad(params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        home, device = params.device, module_device(model)
        params, x, y = params.to(device), x.to(device), y.to(device)
        train = {e.name for e in spec.entries if e.trainable}
        leaves = {
            k: v.detach().requires_grad_(True) if k in train else v.detach()
            for k, v in spec.views(params.clone()).items()
        }
        loss = loss_fn(functional_call(model, leaves, (x,)), y).mean()
        grads = iter(torch.autograd.grad(loss, [leaves[k] for k in leaves if k in train]))
        # buffers (batch-norm running statistics) have no gradient: zeros in their slots
        flat = torch.cat(
            [
                next(grads).reshape(-1) if e.trainable else torch.zeros_like(params[e.slice])
                for e in spec.entries
            ]
        )
        return flat.to(home)

    return grad

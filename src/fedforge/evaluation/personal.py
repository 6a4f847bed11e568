"""Personalised evaluation: Fallah, Mokhtari, Ozdaglar 2020 (Per-FedAvg), whose
personalised model is the global model after one step of local gradient descent
of size alpha on the client's own data, scored on the client's test data.

With ``evaluation.personal.steps`` = k > 0 (and ``evaluation.clients``), every evaluation
round each client starts from the global model (under FedBN with its own batch
norm, as in clienteval.py), takes k SGD steps w <- w - lr grad f(w; D) on
minibatches D of the run's ``batch_size`` drawn without replacement from its
training data (generator (seed, "personal-eval", round, client); null
``batch_size``: the whole training data, no draw), and is scored on its held-out
slice. ``lr`` defaults to Per-FedAvg's alpha under ``perfedavg`` and to the run's
``lr`` otherwise: applied to a FedAvg model this is the baseline "FedAvg +
local fine-tuning", on the same held-out slices as the global model's figures.
The rows go to the run-store table ``personal_eval`` beside ``client_eval``.

Runs on the server in simulation (it reads the clients' data); trusts the data
it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fedforge.algorithms.base import LossFn
from fedforge.algorithms.perfedavg import Gradients, sample_batch
from fedforge.config import Config
from fedforge.core.device import module_device
from fedforge.core.params import ParamSpec
from fedforge.core.rng import torch_generator
from fedforge.evaluation.clients import EvaluatedRun, client_accuracies


def fine_tune(
    model: nn.Module,
    spec: ParamSpec,
    loss_fn: LossFn,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    lr: float,
    batch_size: int | None,
    gen: torch.Generator,
) -> torch.Tensor:
    """``params`` after ``steps`` SGD steps of size ``lr`` on minibatches of
    ``(x, y)`` (see :func:`fedforge.algorithms.perfedavg.sample_batch`), on the
    model's device; a new tensor on the device of ``params``, which is left as it is."""
    grads = Gradients(model, spec, loss_fn)
    model.train()
    home, device = params.device, module_device(model)
    out = params.detach().to(device, copy=True)
    x, y = x.to(device), y.to(device)
    for _ in range(steps):
        idx = sample_batch(len(y), batch_size, gen).to(device)  # drawn on the host
        out = out - lr * grads.grad(out, x[idx], y[idx])[0]
    return out.to(home)


def personal_lr(cfg: Config) -> float:
    """The step size of personalised evaluation (see the module docstring)."""
    if cfg.evaluation.personal.lr is not None:
        return cfg.evaluation.personal.lr
    return cfg.perfedavg.alpha if cfg.algorithm == "perfedavg" else cfg.lr


@dataclass(frozen=True)
class FineTuneClient:
    """``clienteval.AdaptFn``: a client's parameters after its fine-tuning steps."""

    model: nn.Module
    spec: ParamSpec
    loss_fn: LossFn
    data_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    steps: int
    lr: float
    batch_size: int | None
    seed: int
    round_idx: int

    def __call__(self, client_id: int, params: torch.Tensor) -> torch.Tensor:
        if self.steps == 0:
            return params
        x, y = self.data_fn(client_id)
        gen = torch_generator(self.seed, "personal-eval", self.round_idx, client_id)
        model, spec, loss_fn = self.model, self.spec, self.loss_fn
        return fine_tune(
            model, spec, loss_fn, params, x, y, self.steps, self.lr, self.batch_size, gen
        )


def personal_accuracies(
    exp: EvaluatedRun,
    params: torch.Tensor,
    round_idx: int,
    steps: int | None = None,
    lr: float | None = None,
) -> list[tuple[int, float, float, int]]:
    """(client, accuracy, loss, examples) on every client's held-out slice after
    ``steps`` (default ``evaluation.personal.steps``) local steps of size ``lr`` (default
    :func:`personal_lr`) from ``params``; 0 steps: the global model's figures."""
    cfg = exp.cfg
    adapt = FineTuneClient(
        exp.model,
        exp.spec,
        exp.algorithm.loss_fn,
        exp.client_train_data,
        cfg.evaluation.personal.steps if steps is None else steps,
        personal_lr(cfg) if lr is None else lr,
        cfg.batch_size,
        cfg.seed,
        round_idx,
    )
    return client_accuracies(exp, params, adapt)

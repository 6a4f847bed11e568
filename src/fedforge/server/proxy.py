"""The server's proxy set (``proxy:``, config/proxy.py): a small public
labelled set against label skew (Zhao et al. 2018, "Federated Learning with
Non-IID Data"), carved from the training rows so that no client holds it and
the test set never meets it (``data/proxy.py``).

Two uses, each off by default:

- tuning: after every server step, ``tune_epochs`` passes of minibatch SGD on
  the proxy set (``local_sgd``, the clients' own loop, from the stepped model;
  minibatch order from ``torch_generator(seed, "proxy", t)``, t the number of
  steps tuned before, checkpointed with the server optimizer's state).
  :class:`ProxyTuned` wraps the run's server optimizer, so it composes with
  any of them; the round puts back what never moves (FedBN's batch norm,
  frozen entries) after it. It reads only public data and the released model:
  post-processing, which changes no DP guarantee and learns nothing of a client.
- filling: a client whose label histogram (what it would report when it joins)
  lacks classes trains on the proxy's rows of those classes too; the bytes of
  those rows (as the wire would carry them: ``core/wire.py``) are counted in the
  run's downlink once per client, in the first upload round that asks it
  (:func:`shipped_bytes`).

Neither use runs with a concept shift (``partition.concept_shift``, or data
that brings its clients' label maps): each carved row carries its client's
label map, so the one public set would hold contradictory labels; refused when
the run is built (:func:`one_label_map`). A proxy set carved and left unused is
accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedforge.algorithms.base import LossFn
from fedforge.algorithms.plan import LocalPlan
from fedforge.client.local_sgd import local_sgd
from fedforge.config import Config
from fedforge.core import rows, wire
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec, all_finite
from fedforge.core.rng import torch_generator
from fedforge.data import proxy as carving
from fedforge.data.federated import FederatedData
from fedforge.selection.history import NEVER, History
from fedforge.selection.periods import upload_period
from fedforge.server.optimizers import ServerOptimizer
from fedforge.store import RoundRecord

TUNES = "proxy_tunes"  # the server optimizer's state entry: steps tuned so far


@dataclass(frozen=True)
class ProxySet:
    """The proxy set's rows of the training set, and what filling gave each client."""

    rows: np.ndarray  # row numbers into the training set, class by class
    x: torch.Tensor
    y: torch.Tensor
    given: tuple[np.ndarray, ...]  # per client: the proxy rows added to its data
    shipped: np.ndarray  # per client: the bytes of those rows on the wire (0: none)


def assemble(cfg: Config, data: FederatedData) -> tuple[FederatedData, ProxySet | None]:
    """``data`` less the proxy set (and, with ``fill_missing``, the clients short of
    classes given its rows of them), and the proxy set; None without ``proxy.size``."""
    size = cfg.proxy.size
    if size == 0:
        return data, None
    one_label_map(cfg, data)
    classes = data.classes()
    y = data.train_y
    if classes is None or y.dim() != 1 or y.is_floating_point():
        raise ConfigError(
            f"proxy.size = {size} needs one class id a row; the task's labels are "
            f"{y.dtype} of shape {tuple(y.shape[1:]) or '()'} a row"
        )
    labels = y.numpy()
    part, held, picked = carving.carve(
        data.partition, data.holdout, labels, size, classes, cfg.seed
    )
    given = [np.zeros(0, dtype=np.int64)] * part.num_clients
    if cfg.proxy.fills:
        part, given = carving.fill(part, labels, picked, classes, cfg.proxy.fill_per_class)
    data = dataclasses.replace(data, partition=part, holdout=held)
    shipped = np.array([example_bytes(data, g) for g in given], dtype=np.int64)
    idx = torch.from_numpy(picked)
    x, y = rows.take(data.train_x, idx), rows.take(data.train_y, idx)
    return data, ProxySet(picked, x, y, tuple(given), shipped)


def one_label_map(cfg: Config, data: FederatedData) -> None:
    """Refuse tuning or filling where the clients' rows follow several label maps."""
    maps = len(set(data.concepts or ()))
    uses = []
    if cfg.proxy.tunes:
        uses.append("proxy.tune_epochs > 0")
    if cfg.proxy.fills:
        uses.append("proxy.fill_missing")
    if maps < 2 or not uses:
        return
    shift = cfg.partition.concept_shift
    source = f"partition.concept_shift = {shift}" if shift else f"the data's {maps} label maps"
    raise ConfigError(
        f"{' and '.join(uses)} with {source}: the proxy set's rows would carry their "
        "clients' label maps, contradictory labels for one public set; use "
        "partition.concept_shift = 0, or proxy.tune_epochs = 0 and proxy.fill_missing "
        "= false (a proxy.size alone is accepted)"
    )


def example_bytes(data: FederatedData, idx: np.ndarray) -> int:
    """The bytes of training rows ``idx`` (inputs and labels) in the wire format."""
    if len(idx) == 0:
        return 0
    at = torch.from_numpy(idx)
    return wire.encoded_size({"x": rows.take(data.train_x, at), "y": rows.take(data.train_y, at)})


class ProxyTuned:
    """A server optimizer whose every step is followed by SGD on the proxy set."""

    def __init__(
        self,
        inner: ServerOptimizer,
        model: nn.Module,
        spec: ParamSpec,
        proxy: ProxySet,
        plan: LocalPlan,
        loss_fn: LossFn,
        seed: int,
        device: torch.device,
    ) -> None:
        self.inner, self.model, self.spec, self.plan = inner, model, spec, plan
        self.loss_fn, self.seed, self.device = loss_fn, seed, device
        self.x, self.y = proxy.x.to(device), proxy.y.to(device)
        self.tunes = 0

    def step(self, params: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor:
        stepped = self.inner.step(params, aggregate)
        if not all_finite(stepped):  # the round refuses it: nothing to tune
            return stepped
        gen = torch_generator(self.seed, "proxy", self.tunes)
        start, x, y = stepped.to(self.device), self.x, self.y
        tuned = local_sgd(self.model, self.spec, start, x, y, self.plan, self.loss_fn, gen)
        self.tunes += 1
        return tuned.params.to(params.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self.inner.state_dict(), TUNES: torch.tensor(self.tunes)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        rest = dict(state)
        tunes = rest.pop(TUNES, None)
        self.tunes = 0 if tunes is None else int(tunes)
        self.inner.load_state_dict(rest)


def tuning_plan(cfg: Config) -> LocalPlan:
    """The tuning's SGD: ``tune_epochs`` passes in batches of ``tune_batch_size``."""
    p = cfg.proxy
    return LocalPlan(p.tune_epochs, p.tune_batch_size, p.tune_lr, precision=cfg.precision)


def shipped_bytes(
    proxy: ProxySet | None, history: History, record: RoundRecord, upload_every: int, rounds: int
) -> RoundRecord:
    """``record`` with the bytes of the proxy rows shipped this round added to its
    downlink: those of the clients an upload round asked for the first time
    (``history`` as the round left it: their ``first_asked`` is the period's start)."""
    if proxy is None or not proxy.shipped.any():
        return record
    r = record.round_idx
    start, end = upload_period(r, upload_every, rounds)
    if r != end or record.cohort_size == 0:  # nothing travelled this round
        return record
    first = history.column("first_asked", len(proxy.shipped))
    new = int(proxy.shipped[first == start].sum())
    return dataclasses.replace(record, bytes_down=record.bytes_down + new)


def first_shipped(proxy: ProxySet | None, history: History, cohort: Sequence[int]) -> int:
    """The bytes of the proxy rows an upload round ships, known before its outcome
    is in ``history``: those of its ``cohort`` clients never asked before (what
    :func:`shipped_bytes` adds to its record once the round is over)."""
    if proxy is None or not proxy.shipped.any() or not cohort:
        return 0
    first = history.column("first_asked", len(proxy.shipped))
    ids = np.unique(np.asarray(cohort, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < len(proxy.shipped))]
    return int(proxy.shipped[ids[first[ids] == NEVER]].sum())

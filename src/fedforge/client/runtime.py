"""The client side of a round: one picklable task, local training, the encoded update.

Runs on the client; trusts only the payload it decoded and its own data. The
same task runs in-process (serial engine), on a worker (Ray) or on a device
(gRPC client): engines decide where it runs, never what it computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedforge.algorithms.base import Algorithm, LocalPlan
from fedforge.algorithms.local import (
    ClientJob,
    LocalResult,
    full_gradient,
)
from fedforge.client.local_sgd import (
    local_sgd,
    minibatches,
    on_host,
    trainable_views,
)
from fedforge.core import wire
from fedforge.core.device import module_device
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.core.rng import torch_generator
from fedforge.data.drift import DriftSchedule
from fedforge.data.federated import ClientDataFn
from fedforge.pipeline.clip import Clip
from fedforge.pipeline.codec import CodecContext, Dense
from fedforge.pipeline.pipeline import Codec, Stage, StageContext

if TYPE_CHECKING:
    from fedforge.client.gate import ClientGate
    from fedforge.client.reports import Reporter

# A faulty encoder (simulation of an accident, fedforge.robust.attacks): the codec's
# tensors of one client in, what it really sends out.
__all__ = [
    "ClientRuntime",
    "ClientTask",
    "ClientUpload",
    "LocalResult",
    "encode_payload",
    "local_sgd",
    "minibatch_generator",
    "minibatches",
    "on_host",
    "split_extras",
    "trainable_views",
]

TamperFn = Callable[[dict[str, torch.Tensor], StageContext], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class ClientTask:
    """Everything a client needs besides the payload and its own data."""

    client_id: int
    round_idx: int
    plan: LocalPlan
    seed: int


class ClientRuntime:
    """What a client holds between rounds: the model architecture, the algorithm
    bundle and access to its own data. ``run`` turns a payload into an update."""

    def __init__(
        self,
        model: nn.Module,
        spec: ParamSpec,
        algorithm: Algorithm,
        data_fn: ClientDataFn,
        stages: Sequence[Stage] = (),
        codec: Codec | None = None,
        gate: ClientGate | None = None,
        tamper_fn: TamperFn | None = None,
        downlink: Codec | None = None,
        reporter: Reporter | None = None,
        report_loss: bool = True,
        drift: DriftSchedule | None = None,
    ) -> None:
        self.model = model
        self.report_loss = report_loss  # False: the server is not to see it (privacy.py)
        self.spec = spec
        self.algorithm = algorithm
        self.data_fn = data_fn
        self.stages = tuple(stages)
        self.codec: Codec = codec if codec is not None else Dense()
        self.gate = gate  # withholds an update whose held-out loss rose
        self.tamper_fn = tamper_fn
        self.downlink = downlink  # the payload's codec; None: parameters as they are
        self.reporter = reporter  # val_loss / label_counts for the server's weights
        self.drift = drift  # the rows a round reads (data/drift.py); None: fixed data

    def client_data(self, task: ClientTask) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples the task's client trains on in the task's round: its data,
        as the round's phase reads it when the data drifts (data/drift.py)."""
        x, y = self.data_fn(task.client_id)
        if self.drift is None:
            return x, y
        return self.drift.client_rows(x, y, task.round_idx, task.client_id)

    def run(self, task: ClientTask, payload: bytes) -> bytes:
        """Decode the global model, train locally, encode the delta."""
        start, extras = self.start_and_extras(payload)
        x, y = self.client_data(task)
        gen = minibatch_generator(task)
        alg = self.algorithm
        if alg.personal is not None:  # FedBN: the client's own batch norm over the global
            start = alg.personal.start(task.client_id, start)
        state = alg.client.begin([task.client_id], start, extras) if alg.client else None
        result = self.train(task.plan, start, x, y, gen, state)
        return self.conclude(task, start, result, x, y, extras)

    def train(
        self,
        plan: LocalPlan,
        start: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        gen: torch.Generator,
        state: Mapping[str, torch.Tensor] | None,
    ) -> LocalResult:
        """Local training on the model's device: ``start``, the client's data and
        the algorithm's per-client tensors go there; the trained parameters come
        back to the host (``.to`` of a tensor already there is the tensor itself)."""
        alg, model, spec, device = self.algorithm, self.model, self.spec, self.device
        begin, x, y = start.to(device), x.to(device), y.to(device)
        if state is not None:
            state = {k: v.to(device) for k, v in state.items()}
        if alg.local_train is not None:  # the algorithm's own loop (Per-FedAvg)
            result = alg.local_train(model, spec, begin, x, y, plan, alg.loss_fn, gen)
        else:
            result = local_sgd(
                model, spec, begin, x, y, plan, alg.loss_fn, gen, alg.grad_hook, state
            )
        return on_host(result)

    def conclude(
        self,
        task: ClientTask,
        start: torch.Tensor,
        result: LocalResult,
        x: torch.Tensor,
        y: torch.Tensor,
        extras: Mapping[str, torch.Tensor],
    ) -> bytes:
        """After local training: the gate first (a withheld update leaves every
        per-client table as it was: FedBN's batch norm, SCAFFOLD's c_k, the
        error-feedback residual), then the client's own state, then the message."""
        note = self.withheld(task, start, result)
        if note is not None:
            return note
        alg = self.algorithm
        if alg.personal is not None:
            alg.personal.keep(task.client_id, result.params)
        sent: dict[str, torch.Tensor] = {}
        if alg.client is not None:  # its client half: SCAFFOLD's new c_k, delta c_k
            grad_fn = full_gradient(self.model, self.spec, alg.loss_fn)
            job = ClientJob(task.client_id, start, result, x, y, task.plan.lr, extras, grad_fn)
            sent = alg.client.end(job)
        return self.finish(task, start, result, len(y), sent)

    def withheld(self, task: ClientTask, start: torch.Tensor, result: LocalResult) -> bytes | None:
        """The note sent instead of an update the client's gate withholds, or None."""
        if self.gate is None:
            return None
        why = self.gate.check(
            self.model, self.spec, self.algorithm.loss_fn, task.client_id, start, result.params
        )
        if why is None:
            return None
        if not self.report_loss:  # the server is not to see the client's own numbers
            why = "its gate (the losses stay on the client)"
        return wire.encode(
            {}, {"client_id": task.client_id, "round_idx": task.round_idx, "withheld": why}
        )

    @property
    def dtype(self) -> torch.dtype:
        """The run's dtype: its model's."""
        return next(iter(self.model.parameters())).dtype

    @property
    def device(self) -> torch.device:
        """Where local training runs: the model's device (the run's ``device``)."""
        return module_device(self.model)

    @property
    def vector_bytes(self) -> int:
        """Bytes of one parameter vector (a client's weights, a dense update)."""
        return self.spec.size * self.dtype.itemsize

    def start_and_extras(self, payload: bytes) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The global parameters and the algorithm's extra payload tensors (SCAFFOLD's c)."""
        msg = wire.decode(payload)
        params = _payload_params(msg, self.downlink, self.spec.size, self.dtype)
        return params, _extras(msg.tensors)

    def finish(
        self,
        task: ClientTask,
        start: torch.Tensor,
        result: LocalResult,
        n: int,
        sent: Mapping[str, torch.Tensor] | None = None,
    ) -> bytes:
        """The client stages after local training, then the encoded update (with the
        algorithm's extra tensors ``sent``, e.g. SCAFFOLD's delta c_k, beside the delta)."""
        ctx = StageContext(task.round_idx, task.seed, task.client_id)
        delta = result.params - start
        if self.algorithm.update_scale is not None:  # FedNova: d_i / a_i
            delta = delta * self.algorithm.update_scale(result)
        if self.algorithm.personal is not None:  # personal entries never leave the client
            delta = delta.masked_fill(self.algorithm.personal.mask, 0.0)
        # the norm the server's clip bound is relative to (communication.clip_multiple)
        before_clip = float(torch.linalg.vector_norm(delta)) if task.plan.report_norm else None
        if task.plan.upload_clip is not None:  # the round's bound, sent by the server
            delta = Clip(task.plan.upload_clip).apply(delta, ctx)
        for stage in self.stages:
            delta = _same_kind(stage.name, delta, stage.apply(delta, ctx))
        codec_ctx = CodecContext(task.seed, task.round_idx, task.client_id)
        tensors, codec_meta = self.codec.encode(delta, codec_ctx)
        if self.tamper_fn is not None:
            tensors = self.tamper_fn(tensors, ctx)
        tensors = {**tensors, **{EXTRA_PREFIX + k: v for k, v in (sent or {}).items()}}
        meta = {
            **codec_meta,
            "client_id": task.client_id,
            "round_idx": task.round_idx,
            "num_examples": n,
            # a diverged client still uploads (the server refuses its non-finite
            # delta); strict JSON has no NaN, so its loss travels as null
            "train_loss": result.train_loss
            if self.report_loss and math.isfinite(result.train_loss)
            else None,
            "steps": result.steps,
        }
        if before_clip is not None and math.isfinite(before_clip):  # else refused: non-finite
            meta[NORM_BEFORE_CLIP] = before_clip
        if self.reporter is not None:  # fedforge.client.reports: quality or class weights
            meta.update(self.reporter.report(self.model, self.spec, task.client_id, start))
        return wire.encode(tensors, meta)

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        """An extra protocol phase (secure aggregation's keys, shares, unmasking):
        each addressed client's reply to its message, left out when it has none.
        The codec that needs the phases (``SecAggCodec``) answers them."""
        answer = getattr(self.codec, "phase", None)
        if answer is None:
            raise ValueError(f"codec '{self.codec.name}' has no protocol phase '{phase}'")
        replies = {}
        for client_id, message in messages.items():
            reply = answer(phase, client_id, message)
            if reply is not None:
                replies[client_id] = reply
        return replies


def _same_kind(stage: str, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """A client stage's output, which must be a vector like its input: the codec
    alone decides what goes on the wire (so the bytes counted are the codec's)."""
    if (
        not isinstance(after, torch.Tensor)
        or after.shape != before.shape
        or after.dtype != before.dtype
    ):
        got = (
            f"{tuple(after.shape)} {after.dtype}"
            if isinstance(after, torch.Tensor)
            else type(after).__name__
        )
        raise ConfigError(
            f"client stage '{stage}' returned {got}; a stage returns the update's "
            f"{tuple(before.shape)} {before.dtype} (a wire format is a codec's: register_codec)"
        )
    return after


EXTRA_PREFIX = "alg/"  # wire names of an algorithm's tensors beside params or delta
# the header field of a delta's L2 norm before the client's clip (LocalPlan.report_norm)
NORM_BEFORE_CLIP = "norm_before_clip"


def encode_payload(
    params: torch.Tensor,
    round_idx: int,
    codec: Codec | None = None,
    seed: int = 0,
    extras: Mapping[str, torch.Tensor] | None = None,
) -> bytes:
    """The payload of a round: the global parameters, as they are or by ``codec``,
    and the algorithm's ``extras`` (dense, e.g. SCAFFOLD's server control c)."""
    more = {EXTRA_PREFIX + k: v for k, v in (extras or {}).items()}
    if codec is None:
        return wire.encode({"params": params, **more}, {"round_idx": round_idx})
    tensors, meta = codec.encode(params, CodecContext(seed, round_idx))
    return wire.encode({**tensors, **more}, {**meta, "round_idx": round_idx})


def split_extras(
    tensors: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A message's tensors as (codec tensors, algorithm extras without the prefix)."""
    own = {k: v for k, v in tensors.items() if not k.startswith(EXTRA_PREFIX)}
    return own, _extras(tensors)


def _extras(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    n = len(EXTRA_PREFIX)
    return {k[n:]: v for k, v in tensors.items() if k.startswith(EXTRA_PREFIX)}


def _payload_params(
    msg: wire.Message, codec: Codec | None, size: int, dtype: torch.dtype
) -> torch.Tensor:
    """The global parameters of a payload: as they are, or decoded by ``codec``
    into ``size`` parameters of ``dtype``."""
    own = split_extras(msg.tensors)[0]
    if codec is None:
        return own["params"]
    return codec.decode(own, msg.meta, size, dtype)


def minibatch_generator(task: ClientTask) -> torch.Generator:
    """The generator of a client's minibatch order in one round; every engine uses it."""
    return torch_generator(task.seed, "minibatch", task.round_idx, task.client_id)


@dataclass(frozen=True)
class ClientUpload:
    """An encoded update as it arrives at the server, with the client's wall time;
    ``settle``, if given, is told the collector's verdict (None: taken, else why
    refused): a deployment answers the uploader with it."""

    client_id: int
    data: bytes
    seconds: float
    settle: Callable[[str | None], None] | None = field(default=None, compare=False, repr=False)

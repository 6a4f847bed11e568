"""The server's first look at every upload, whichever collector takes it: whose
it is, whether it is a well-formed delta, and the per-upload stages.

A round takes one upload per client that was asked to train; an upload from a
client outside the round's cohort, or a second one from the same client, is
refused with the reason and never reaches the aggregate. Each update is decoded
by the pipeline's codec and refused when malformed (shape, dtype, non-finite
values, a header that does not match the client and round, the algorithm's
tensors beside the delta), or absurd: an L2 norm (of the delta, and of each
model-sized tensor beside it) past ``robust.max_update_ratio``
times ||w|| + sqrt(P) (the round's global model's norm plus that of a vector of
ones: a bound no honest update of a sane learning rate comes near), or past
``robust.max_norm_multiple`` times the median norm of the updates taken in the
recent rounds (``robust/typical_norm.py``; under ``local.lr_rule_scales_bounds``
a client the lr rule speeds up s-fold has s times the room; in a round with none behind it the
collector holds the uploads and judges them by their own median at the end:
:meth:`Intake.settle`). An accepted update's weight is its reported
``num_examples`` within the registry's bounds (``server/registry.py``). Runs on
the server; trusts nothing it decodes.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fedforge.algorithms.local import ServerTerms
from fedforge.client.reports import ClientReport, read_report
from fedforge.client.runtime import split_extras
from fedforge.core import wire
from fedforge.core.errors import UploadError, Withheld, shown
from fedforge.core.params import all_finite
from fedforge.pipeline.codec import CodecContext
from fedforge.pipeline.pipeline import Codec, StageContext
from fedforge.robust.typical_norm import RelativeBound
from fedforge.server.collectors.base import DenseCost, RoundLog
from fedforge.server.experiment import Experiment
from fedforge.server.registry import Registry
from fedforge.server.update_header import read_norm_before_clip, read_update_header
from fedforge.store import ClientRecord


@dataclass
class Upload:
    """A decoded, well-formed update."""

    client_id: int
    delta: torch.Tensor
    num_examples: int
    train_loss: float
    nbytes: int
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. SCAFFOLD's delta c_k
    report: ClientReport | None = None  # val_loss / label_counts for the weights
    weight: float | None = None  # num_examples within the registry's bounds (intake)
    norm: float = math.nan  # the decoded delta's L2 norm, before the per-upload stages
    before_clip: float | None = None  # the norm before the client's clip, as it reported

    def weighed(self) -> float:
        """The update's aggregation weight: its bounded count, once the intake set it."""
        return float(self.num_examples) if self.weight is None else self.weight

    def clip_norm(self) -> float:
        """What ``communication.clip_multiple``'s median counts it at: its reported
        norm before its clip; as decoded when it reports none."""
        return self.norm if self.before_clip is None else self.before_clip


@dataclass(frozen=True)
class UpdateForm:
    """What a well-formed update of a run is, apart from the run itself
    (picklable: a Ray worker checks its clients' updates with it, partial.py)."""

    size: int
    dtype: torch.dtype
    seed: int
    weights: str  # aggregation.weights: which reports an update carries
    classes: int
    algorithm: str
    server: ServerTerms | None  # the algorithm's server half: what it admits

    @classmethod
    def of(cls, exp: Experiment) -> UpdateForm:
        cfg = exp.cfg
        return cls(
            exp.spec.size,
            exp.initial_params.dtype,
            cfg.seed,
            cfg.aggregation.weights,
            exp.data.classes() or 0,
            cfg.algorithm,
            exp.algorithm.server,
        )


def check_update(exp: Experiment, client_id: int, round_idx: int, data: bytes) -> Upload:
    """Decode one update and refuse anything that is not a well-formed delta."""
    return check_form(UpdateForm.of(exp), exp.pipeline.codec, client_id, round_idx, data)


def check_form(
    form: UpdateForm, codec: Codec, client_id: int, round_idx: int, data: bytes
) -> Upload:
    """:func:`check_update` by a run's ``form`` and uplink ``codec``."""
    msg = wire.decode(data)
    if "withheld" in msg.meta:  # the client's own gate kept its update back
        raise Withheld(f"withheld by the client: {msg.meta['withheld']!s:.300}")
    dtype = form.dtype
    ctx = CodecContext(form.seed, round_idx, client_id)
    own, extras = split_extras(msg.tensors)
    delta = codec.decode(own, msg.meta, form.size, dtype, ctx)
    if tuple(delta.shape) != (form.size,) or delta.dtype != dtype:
        raise UploadError(
            f"decoded delta has shape {shown(tuple(delta.shape))} and dtype {delta.dtype}; "
            f"expected ({form.size},) {dtype}"
        )
    if not all_finite(delta):
        raise UploadError("delta holds non-finite values (NaN or inf)")
    n, train_loss = read_update_header(msg.meta, client_id, round_idx)
    report = read_report(msg.meta, form.weights, n, form.classes)
    kept = _admitted(form, _form_extras(form, extras), delta, n)
    up = Upload(client_id, delta, n, train_loss, len(data), kept, report)
    up.before_clip = read_norm_before_clip(msg.meta)
    return up


def admitted(
    exp: Experiment, extras: dict[str, torch.Tensor], delta: torch.Tensor, num_examples: int
) -> dict[str, torch.Tensor]:
    """One client's tensors as the algorithm's server half admits them: checked
    against its delta and example count, or recomputed from them."""
    return _admitted(UpdateForm.of(exp), extras, delta, num_examples)


def _admitted(
    form: UpdateForm, extras: dict[str, torch.Tensor], delta: torch.Tensor, num_examples: int
) -> dict[str, torch.Tensor]:
    server = form.server
    if server is None:
        return extras
    try:
        return server.admit(delta, extras, num_examples)
    except ValueError as exc:
        raise UploadError(f"algorithm {form.algorithm!r} refuses the update: {exc}") from None


def check_extras(exp: Experiment, extras: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The algorithm's tensors an update must carry beside the delta (SCAFFOLD's
    delta c_k), each refused unless [P] (or the size the server terms declare in
    ``update_sizes``: SCAFFOLD's controls on a subset) or a scalar [1] (FedNova's n_i tau_i), the
    run's dtype and finite."""
    return _form_extras(UpdateForm.of(exp), extras)


def _form_extras(form: UpdateForm, extras: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    server = form.server
    wanted = () if server is None else server.update_tensors
    unexpected = sorted(set(extras) - set(wanted))
    if unexpected:
        raise UploadError(
            f"update carries unexpected algorithm tensors {', '.join(unexpected)[:200]}; "
            f"{form.algorithm} sends {', '.join(wanted) or 'none'}"
        )
    if server is None:
        return {}
    dtype = form.dtype
    sizes = getattr(server, "update_sizes", {})  # a tensor over a subset of the model
    for name in server.update_tensors:
        t, size = extras.get(name), sizes.get(name, form.size)
        if t is None or tuple(t.shape) not in ((size,), (1,)) or t.dtype != dtype:
            got = "nothing" if t is None else f"{shown(tuple(t.shape))} {t.dtype}"
            raise UploadError(
                f"'{name}' must be ({size},) or (1,) {dtype}; the update carries {got}"
            )
        if not all_finite(t):
            raise UploadError(f"'{name}' holds non-finite values (NaN or inf)")
    return {name: extras[name] for name in server.update_tensors}


@dataclass
class Judged:
    """One upload as judged by its form and norms: the decoded upload (None when it
    did not decode), why it is refused (None: well-formed and within the bounds),
    and whether the refusal is a fault (a client's own withholding is not)."""

    upload: Upload | None
    why: str | None
    faulty: bool


def judge(
    form: UpdateForm, codec: Codec, limits: Limits, client_id: int, round_idx: int, data: bytes
) -> Judged:
    """Decode one update and hold it to its form and the round's norm bounds."""
    up = None
    try:
        up = check_form(form, codec, client_id, round_idx, data)
        up.norm = limits.check_norm("update", up.delta)
        limits.check_relative(client_id, up.norm)
        for name, tensor in up.extras.items():  # SCAFFOLD's delta c_k reaches c
            if tensor.numel() > 1:  # a scalar (FedNova's n_i a_i) is no model vector
                limits.check_norm(f"'{name}'", tensor)
    except UploadError as exc:
        return Judged(up, str(exc), not isinstance(exc, Withheld))
    return Judged(up, None, False)


def weighs_nothing(client_id: int, num_examples: int, limits: Limits) -> str:
    """Why an update whose bounded count is 0 is refused."""
    return (
        f"client {client_id}'s update weighs nothing: it reports {num_examples} "
        f"examples and may claim at most {limits.registry.limits[client_id]:g}"
    )


@dataclass(frozen=True)
class Limits:
    """What a round accepts of an update beyond its form: the weight its count may
    claim, the largest norm (None: no bound), the bound relative to the recent
    rounds' norms (None: off), and the factor of that bound each client the lr
    rule speeds up gets (``client_lr.bound_rooms``; a client not in it: 1)."""

    registry: Registry
    max_norm: float | None
    relative: RelativeBound | None = None
    rooms: Mapping[int, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        exp: Experiment,
        params: torch.Tensor,
        recent: Sequence[Sequence[float]] = (),
        rooms: Mapping[int, float] | None = None,
    ) -> Limits:
        """The limits of a round whose global model is ``params``, after rounds that
        took updates of the norms in ``recent``, its sped-up clients given
        ``rooms``."""
        robust = exp.cfg.robust
        registry = Registry(exp.client_sizes(), robust.max_weight_ratio)
        multiple = robust.max_norm_multiple
        relative = None if multiple is None else RelativeBound.of(multiple, recent)
        ratio = robust.max_update_ratio
        rooms = dict(rooms or {})
        if ratio is None:
            return cls(registry, None, relative, rooms)
        size = float(params.norm()) + math.sqrt(params.numel())
        return cls(registry, ratio * size, relative, rooms)

    def room(self, client_id: int) -> float:
        """The factor of the relative bound a client's update is held to."""
        return self.rooms.get(client_id, 1.0)

    @property
    def waits(self) -> bool:
        """Whether the round's updates wait for the median of their own norms."""
        return self.relative is not None and self.relative.waits

    def check_norm(self, what: str, vec: torch.Tensor) -> float:
        """Refuse a vector whose norm passes the bound (an infinite norm too); its norm."""
        norm = float(vec.norm())
        if self.max_norm is not None and not norm <= self.max_norm:
            raise UploadError(
                f"{what} norm {norm:.4g} passes the bound {self.max_norm:.4g} = "
                f"robust.max_update_ratio x (||w|| + sqrt(P))"
            )
        return norm

    def check_relative(self, client_id: int, norm: float) -> None:
        """Refuse an update norm past the multiple of the recent rounds' median
        (times the client's room)."""
        room = self.room(client_id)
        why = None if self.relative is None else self.relative.refusal(norm, room)
        if why is not None:  # as absurd as the absolute bound's: a fault (Krum's f)
            raise UploadError(why)


class Intake:
    """One round's admission of uploads: one per expected client, well-formed,
    through the per-upload stages. Counts what arrived, and what it would have
    cost as dense float32 (``float32_up``: the delta, and the tensors beside it
    at their own sizes; a message that does not decode, its delta alone)."""

    def __init__(
        self,
        exp: Experiment,
        round_idx: int,
        expected: Collection[int],
        log: RoundLog,
        payload_bytes: int,
        limits: Limits,
        dense: DenseCost,
    ) -> None:
        self.exp, self.round_idx, self.log, self.limits = exp, round_idx, log, limits
        self.form = UpdateForm.of(exp)  # what every upload of the round is held to
        self.expected = frozenset(expected)
        self.payload_bytes = payload_bytes
        self.seen: set[int] = set()
        self.bytes_up = 0
        self.dense, self.float32_up = dense, 0
        self.faulty = 0  # refused as malformed, non-finite or past a norm bound: faults
        self.accepted = 0
        self.norms: dict[int, float] = {}  # the accepted updates' norms (before stages)
        self.clip_norms: dict[int, float] = {}  # ... and before their clients' clip

    def take(self, client_id: int, data: bytes, trained_from: int | None = None) -> Upload | str:
        """The checked upload, or why it is refused (logged). ``trained_from``: the
        round whose task the update answers (its header's, its stages' randomness),
        when not this round's (a buffered asynchronous update)."""
        self.bytes_up += len(data)
        task_round = self.round_idx if trained_from is None else trained_from
        why = self._admit(client_id)
        if why is None:
            judged = judge(
                self.form,
                self.exp.pipeline.codec,
                self.limits,
                client_id,
                task_round,
                data,
            )
            self._count(judged, self.dense.extras(judged.upload.extras) if judged.upload else 0)
            why = judged.why
        if why is not None:
            self.log.reject(client_id, why)
            return why
        up = judged.upload
        assert up is not None
        ctx = StageContext(task_round, self.exp.cfg.seed, client_id)
        up.delta = self.exp.pipeline.run_upload(up.delta, ctx)
        up.weight = self.limits.registry.weight(client_id, up.num_examples)
        if up.weight <= 0 and self.exp.cfg.aggregation.weights == "num_examples":
            why = weighs_nothing(client_id, up.num_examples, self.limits)
            self.log.reject(client_id, why)
            return why
        self.accepted += 1
        self.norms[client_id], self.clip_norms[client_id] = up.norm, up.clip_norm()
        return up

    def _count(self, judged: Judged, extras_bytes: int) -> None:
        """A judged upload in the round's counts: a fault, and its dense cost (a
        withheld note has none; an undecoded message, its delta's)."""
        if judged.faulty:
            self.faulty += 1
        if judged.upload is not None:
            self.float32_up += self.dense.up + extras_bytes
        elif judged.faulty:
            self.float32_up += self.dense.up

    def settle(self, held: Sequence[Upload]) -> list[Upload]:
        """Of the uploads a round without norms behind it held back, the ones within
        ``robust.max_norm_multiple`` x the median of their norms, in order; the
        others are refused (logged)."""
        relative = self.limits.relative
        if relative is None or not held:
            return list(held)
        kept = []
        norms = [u.norm for u in held]
        rooms = [self.limits.room(u.client_id) for u in held]
        for up, why in zip(held, relative.cohort_refusals(norms, rooms), strict=True):
            if why is None:
                kept.append(up)
                continue
            self.log.reject(up.client_id, why)
            self.accepted -= 1
            self.faulty += 1
            del self.norms[up.client_id], self.clip_norms[up.client_id]
        return kept

    def _admit(self, client_id: int) -> str | None:
        if client_id not in self.expected:
            return f"client {client_id} was not asked to train in round {self.round_idx + 1}"
        if client_id in self.seen:
            return f"client {client_id} already sent an update in round {self.round_idx + 1}"
        self.seen.add(client_id)
        return None

    @property
    def arrived(self) -> int:
        """The cohort's update messages that arrived: refused as faulty, or decoded
        (a withheld note carries no update)."""
        return self.faulty + self.accepted

    def record(self, up: Upload, update_norm: float) -> ClientRecord:
        return ClientRecord(
            self.round_idx,
            up.client_id,
            up.num_examples,
            up.train_loss,
            update_norm,
            up.nbytes,
            self.payload_bytes,
        )

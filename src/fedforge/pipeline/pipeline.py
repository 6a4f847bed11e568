"""The round as two pipelines of small stages with explicit state (DESIGN idea 2).

client: local training -> [client stages: clip, DP noise, mask] -> codec.encode
server: codec.decode -> [per-upload stages: unmask] -> [cohort stages: validate]
        -> aggregate -> [aggregate stages: central DP noise] -> server optimizer

Local training is always the first client stage (it turns the payload into a
delta); the codec (dense, quantised, sparse) is the client's last stage and
the server's first, around the wire format. Cohort stages see the whole
cohort's updates at once (a robust z-score gate, simulated colluding
attackers); with none of them and a linear aggregator the server streams a
running sum and holds O(model), not O(cohort). A stage says where it runs, keeps
its own state, and never reaches into another stage.

Each stage, and the codec, declares what it needs of the pipeline around it as
typed :class:`Constraint` objects in its ``constraints`` (e.g. "I come after a
clip", "the aggregator must be the DP mean", "I am the first cohort stage"),
and vector stages say what they are in ``role`` and ``linear``. The pipeline
checks its own shape and every declared constraint of every part when it is
built, and refuses what cannot work, saying why. No check knows a stage by
name: the checks of a pipeline are those its parts carry (the vocabulary is in
``pipeline/constraints.py``), the config's named stages (``pipeline/named.py``)
included.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from fedforge.aggregation.mean import Aggregator
from fedforge.core.errors import ConfigError
from fedforge.pipeline.codec import CodecContext, Dense, Encoded

Where = Literal["client", "server_upload", "server_cohort", "server_aggregate"]

# What a vector stage is, as the constraints read it: a clip bounds the update's
# norm, a noise stage adds DP noise calibrated to that bound, an attack rewrites
# (simulated) attackers' updates; anything else is "other".
Role = Literal["clip", "noise", "attack", "other"]

# What a cohort stage does to the rows it passes on, as the constraints read it: a
# gate passes the rows it keeps on as they came (it may drop rows, or set weights); an
# attack rewrites (simulated) attackers' rows; anything else may rewrite any row.
CohortRole = Literal["gate", "attack", "other"]


@dataclass
class StageContext:
    """What a stage may know of where it runs. ``state`` is the stage's own
    persistent state (per client for client stages, per server otherwise)."""

    round_idx: int
    seed: int
    client_id: int | None = None
    state: dict[str, Any] = field(default_factory=dict)


class Constraint(Protocol):
    """What one part of a pipeline (``owner``: a stage or the codec) needs of the
    pipeline it is in: None when the pipeline is fine, else why it cannot work."""

    def check(self, pipeline: Pipeline, owner: Part) -> str | None: ...


class Stage(Protocol):
    """One vector-to-vector step of a round."""

    name: str
    where: Where
    role: Role
    linear: bool  # commutes with the sum: allowed before secure aggregation

    @property
    def constraints(self) -> tuple[Constraint, ...]: ...

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor: ...


@dataclass
class CohortUpdates:
    """The accepted updates of one round, one row each."""

    client_ids: list[int]
    updates: torch.Tensor  # [K, P]
    weights: torch.Tensor  # [K]
    # what each client reported beside its update, by client id (fedforge.client.reports)
    reports: Mapping[int, Any] = field(default_factory=dict)


class CohortStage(Protocol):
    """A step over the whole cohort; returns what goes on to the aggregator and
    the (client id, reason) of each update it refused."""

    name: str
    where: Where  # always "server_cohort"
    role: CohortRole

    @property
    def constraints(self) -> tuple[Constraint, ...]: ...

    def apply(
        self, cohort: CohortUpdates, ctx: StageContext
    ) -> tuple[CohortUpdates, list[tuple[int, str]]]: ...


class Codec(Protocol):
    """Turns a delta into wire tensors and back (``pipeline/codec.py``)."""

    name: str
    linear: bool  # decode(encode(a)) + decode(encode(b)) == decode(encode(a + b))
    lossy: bool  # decode(encode(x)) may differ from x

    @property
    def constraints(self) -> tuple[Constraint, ...]: ...

    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded: ...

    def decode(
        self,
        tensors: Mapping[str, torch.Tensor],
        meta: Mapping[str, Any],
        size: int,
        dtype: torch.dtype,
        ctx: CodecContext | None = None,
    ) -> torch.Tensor: ...


Part = Stage | CohortStage | Codec  # what may declare constraints


def _stages_in_place(p: Pipeline) -> str | None:
    placed: tuple[tuple[str, tuple[Stage, ...] | tuple[CohortStage, ...]], ...] = (
        ("client", p.client),
        ("server_upload", p.server_upload),
        ("server_cohort", p.cohort),
        ("server_aggregate", p.server_aggregate),
    )
    for where, stages in placed:
        for s in stages:
            if s.where != where:
                return f"stage '{s.name}' runs on '{s.where}' but was placed in the {where} stages"
    return None


def _unique_names(p: Pipeline) -> str | None:
    names = [s.name for s in (*p.client, *p.server_upload, *p.server_aggregate)]
    names += [s.name for s in p.cohort]
    dupes = sorted({n for n in names if names.count(n) > 1})
    return f"stages appear twice: {', '.join(dupes)}" if dupes else None


@dataclass(frozen=True)
class Pipeline:
    """The stages of one round around a given aggregator, checked when built."""

    aggregator: Aggregator
    client: tuple[Stage, ...] = ()
    codec: Codec = field(default_factory=Dense)
    server_upload: tuple[Stage, ...] = ()
    cohort: tuple[CohortStage, ...] = ()
    server_aggregate: tuple[Stage, ...] = ()

    def __post_init__(self) -> None:
        reason = next(self.refusals(), None)
        if reason is not None:
            raise ConfigError(f"pipeline refused: {reason}")

    def refusals(self) -> Iterator[str]:
        """Why this pipeline cannot work: its shape (each stage where it runs, no
        name twice), then each part's declared constraints, in the round's order."""
        for shape in (_stages_in_place, _unique_names):
            reason = shape(self)
            if reason is not None:
                yield reason
        for part in self.parts:
            for constraint in part.constraints:
                reason = constraint.check(self, part)
                if reason is not None:
                    yield reason

    @property
    def parts(self) -> tuple[Part, ...]:
        """The stages and the codec, in the order a round runs them."""
        return (*self.client, self.codec, *self.server_upload, *self.cohort, *self.server_aggregate)

    @property
    def streams(self) -> bool:
        """True when the server can aggregate as updates arrive (running sum)."""
        agg = self.aggregator
        return agg.linear and not agg.needs_individual and not self.cohort

    def describe(self) -> str:
        """The whole round in one line, e.g. for the run summary."""
        client = ["local_training", *(s.name for s in self.client), f"encode:{self.codec.name}"]
        server = [f"decode:{self.codec.name}", *(s.name for s in self.server_upload)]
        server += [s.name for s in self.cohort] + [self.aggregator.name]
        server += [s.name for s in self.server_aggregate] + ["server_optimizer"]
        return "client: " + " -> ".join(client) + " | server: " + " -> ".join(server)

    def run_upload(self, delta: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        return _run(self.server_upload, delta, ctx)

    def run_aggregate(self, aggregate: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        return _run(self.server_aggregate, aggregate, ctx)


def _run(stages: tuple[Stage, ...], vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
    for stage in stages:
        vec = stage.apply(vec, ctx)
    return vec

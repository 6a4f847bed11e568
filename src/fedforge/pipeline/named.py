"""Codecs and stages by name: :func:`register_codec`, :func:`register_stage` and
their factory contracts.

A codec factory takes a ``ComponentContext`` (config/components.py; ``spec``
set: the model's entries) and returns a :class:`~fedforge.pipeline.pipeline.Codec`:
``encode(delta) -> Encoded`` and ``decode(tensors, meta, size, dtype) -> delta``,
``linear`` when decoding commutes with sums (secure aggregation, streaming),
``lossy`` when ``decode(encode(x))`` may differ from ``x`` (then error feedback
applies), and the ``constraints`` it puts on the pipeline it joins. A config
names one as ``communication.uplink`` (or ``downlink``).

A stage factory (``spec`` and ``dtype`` set) returns a
:class:`~fedforge.pipeline.pipeline.Stage` (one vector-to-vector step on the
client or server side: a clip, a transform, a check) or a ``CohortStage`` (a step
over the cohort's rows, which may refuse some). A config names one in
``pipeline.client`` (a stage whose ``where`` is ``client``: run right after local
training, before the built-in clip, DP noise and the codec) or ``pipeline.server``
(placed by its ``where``: ``server_upload``, each decoded update;
``server_cohort``, after the robust gates; ``server_aggregate``, after central
DP noise). Its contract: ``apply`` is a function of the vector and its
``StageContext`` (round, seed, client id), so reruns are bit-identical and a
resume continues exactly (a named stage keeps no state of its own between calls:
``ctx.state`` is the built-in privacy state on the aggregate, empty elsewhere);
it returns a vector of the input's size and dtype; and the ``role``, ``linear``
and ``constraints`` it declares are checked with the built-ins' when the pipeline
is built (``pipeline/constraints.py``: under secure aggregation no stage may need
an individual update; between the clip and central DP noise no upload stage may
run, nor a cohort stage whose ``role`` is not ``gate``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from fedforge.config import Config
from fedforge.config.components import make
from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.pipeline.pipeline import Codec, CohortStage, Stage

if TYPE_CHECKING:
    import torch

    from fedforge.config.components import ComponentContext
    from fedforge.core.params import ParamSpec


class CodecFactory(Protocol):
    def __call__(self, context: ComponentContext) -> Codec: ...


class StageFactory(Protocol):
    def __call__(self, context: ComponentContext) -> Stage | CohortStage: ...


def register_codec(
    name: str,
    factory: CodecFactory | Callable[[ComponentContext], Codec],
    *,
    options: type | None = None,
    replace: bool = False,
) -> None:
    """Register ``factory`` as the codec ``name`` (``communication.uplink: NAME``)."""
    registry.register("codec", name, factory, options=options, replace=replace)


def register_stage(
    name: str,
    factory: StageFactory | Callable[[ComponentContext], Stage | CohortStage],
    *,
    options: type | None = None,
    replace: bool = False,
) -> None:
    """Register ``factory`` as the pipeline stage ``name`` (``pipeline.client: [NAME]``
    or ``pipeline.server: [NAME]``, by the stage's ``where``)."""
    registry.register("stage", name, factory, options=options, replace=replace)


@dataclass(frozen=True)
class NamedStages:
    """The stages a config names, by where the round runs them."""

    client: tuple[Stage, ...] = ()
    upload: tuple[Stage, ...] = ()
    cohort: tuple[CohortStage, ...] = ()
    aggregate: tuple[Stage, ...] = ()


SERVER_SIDES = ("server_upload", "server_cohort", "server_aggregate")


def named_stages(cfg: Config, spec: ParamSpec, dtype: torch.dtype) -> NamedStages:
    """The stages of ``cfg.pipeline``, each built by its registered factory and
    placed by its ``where``; one on the wrong side is refused in one line."""

    client = [
        _stage(cfg, "pipeline.client", n, spec, dtype, ("client",)) for n in cfg.pipeline.client
    ]
    server = [
        _stage(cfg, "pipeline.server", n, spec, dtype, SERVER_SIDES) for n in cfg.pipeline.server
    ]

    def side(where: str) -> tuple[Any, ...]:
        return tuple(s for s in server if s.where == where)

    return NamedStages(
        cast(tuple[Stage, ...], tuple(client)),
        side("server_upload"),
        side("server_cohort"),
        side("server_aggregate"),
    )


def _stage(
    cfg: Config, field: str, name: str, spec: ParamSpec, dtype: torch.dtype, sides: tuple[str, ...]
) -> Stage | CohortStage:
    stage: Stage | CohortStage = make("stage", name, cfg, field, spec, dtype)
    where = getattr(stage, "where", None)
    if where not in sides:
        other = "pipeline.server" if field == "pipeline.client" else "pipeline.client"
        raise ConfigError(
            f"{field}: stage {name!r} runs on {where!r}; {field} takes stages that run on "
            f"{' or '.join(repr(s) for s in sides)} (name it under {other})"
        )
    if not callable(getattr(stage, "apply", None)):
        raise ConfigError(f"{field}: stage {name!r} has no apply(vec, ctx)")
    return stage

"""Codecs and stages by name: :func:`register_codec`, :func:`register_stage` and
their factory contracts.

A codec factory takes a ``ComponentContext`` (config/components.py; ``spec``
set: the model's entries) and returns a :class:`~fedforge.pipeline.pipeline.Codec`:
``encode(delta) -> Encoded`` and ``decode(tensors, meta, size, dtype) -> delta``,
``linear`` when decoding commutes with sums (secure aggregation, streaming),
``lossy`` when ``decode(encode(x))`` may differ from ``x`` (then error feedback
applies), and the ``constraints`` it puts on the pipeline it joins. A config
names one as ``communication.uplink`` (or ``downlink``).

A stage factory returns a :class:`~fedforge.pipeline.pipeline.Stage` (one
vector-to-vector step on the client or server side: clip, noise, a check) or a
``CohortStage`` (a step over the cohort's rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fedforge.core import registry
from fedforge.pipeline.pipeline import Codec, CohortStage, Stage

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext


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
    """Register ``factory`` as the pipeline stage ``name``."""
    registry.register("stage", name, factory, options=options, replace=replace)

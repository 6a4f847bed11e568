"""The built-in codecs' factories, by the names core/builtins.py registers: each
reads its parameters from the config's ``communication`` section."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedforge.communication.quantize import Cast, Quantize
from fedforge.communication.sparsify import RandomK, TopK
from fedforge.pipeline.codec import Dense
from fedforge.pipeline.pipeline import Codec

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext


def dense(context: ComponentContext) -> Codec:
    return Dense()


def cast(context: ComponentContext) -> Codec:
    return Cast(context.name)


def quantize(context: ComponentContext) -> Codec:
    """int8, int4, int2 and sign (1 bit): one scale per chunk or per tensor."""
    com, spec = context.cfg.communication, context.spec
    if spec is None:
        raise ValueError(f"codec {context.name!r} needs the model's spec (its tensor sizes)")
    bits = 1 if context.name == "sign" else int(context.name[3:])
    chunk = com.chunk_size if com.scale == "chunk" else None
    sizes = [e.numel for e in spec.entries]
    return Quantize(bits, com.rounding == "stochastic", chunk, sizes)


def topk(context: ComponentContext) -> Codec:
    return TopK(context.cfg.communication.fraction)


def randk(context: ComponentContext) -> Codec:
    com = context.cfg.communication
    return RandomK(com.fraction, com.randk_per_client)

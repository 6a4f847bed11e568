"""Codecs: how a delta becomes the tensors of an update message and back.

A codec is the client's last stage and the server's first: ``encode`` gives
the named tensors (and metadata) the wire format carries, ``decode`` rebuilds
the ``[P]`` delta and refuses anything malformed with an :class:`UploadError`.
``Dense`` sends the delta as it is; compression codecs (``quantize.py``,
``sparsify.py``) implement the same protocol (``pipeline.pipeline.Codec``) and
name themselves in the message meta (``"codec"``). Those built on
:class:`WireCodec` share its ``decode``: the header and the tensor names are
checked first, then the codec's ``rebuild`` gets the :class:`Received` update.
A :class:`CodecContext` (seed, round, client) gives randomised codecs their
derived generator and lets random-k rebuild its index set on the server. Runs
on both sides; the decode side trusts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

import torch

from fedforge.core.errors import UploadError, shown
from fedforge.core.rng import torch_generator


@dataclass(frozen=True)
class CodecContext:
    """Where a message is encoded or decoded: the run seed, the round and the
    client (``None`` for a message of the server: the payload, an edge update)."""

    seed: int
    round_idx: int
    client_id: int | None = None

    def generator(self, purpose: str) -> torch.Generator:
        """The derived generator of ``purpose`` for this round and client."""
        who = "server" if self.client_id is None else self.client_id
        return torch_generator(self.seed, purpose, self.round_idx, who)


# What ``encode`` returns: the named tensors of the message and its meta.
Encoded = tuple[dict[str, torch.Tensor], dict[str, Any]]


def need_context(ctx: CodecContext | None, codec: str) -> CodecContext:
    """``ctx``, which a randomised codec cannot do without (a programming error)."""
    if ctx is None:
        raise ValueError(f"codec '{codec}' draws random numbers and needs a CodecContext")
    return ctx


def expect_codec(
    meta: Mapping[str, Any], name: str, tensors: Mapping[str, torch.Tensor], names: Set[str]
) -> None:
    """Refuse an update whose header does not name codec ``name`` (an unnamed one is
    dense), or that carries a tensor other than ``names`` (junk the server would
    receive, count and drop unseen)."""
    got = meta.get("codec", Dense.name)
    if got != name:
        raise UploadError(f"wrong header: update encoded by codec {got!r:.40}; expected '{name}'")
    unexpected = sorted(set(tensors) - names)
    if unexpected:
        raise UploadError(
            f"update carries unexpected tensors {', '.join(unexpected)[:200]}; codec '{name}' "
            f"sends {', '.join(sorted(names))}"
        )


def expect_tensor(
    tensors: Mapping[str, torch.Tensor],
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """The tensor ``name`` of an update, refused unless it has ``shape`` and ``dtype``."""
    t = tensors.get(name)
    if t is None:
        raise UploadError(f"update carries no '{name}' tensor (has: {shown(list(tensors))})")
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise UploadError(
            f"'{name}' has shape {shown(tuple(t.shape))} and dtype {t.dtype}; "
            f"expected {shown(shape)} {dtype}"
        )
    return t


@dataclass(frozen=True)
class Received:
    """An update as a codec's ``rebuild`` gets it: the tensors and meta of the
    message (header and tensor names already checked), the ``size`` and ``dtype``
    of the delta to rebuild, and the context of randomised codecs."""

    tensors: Mapping[str, torch.Tensor]
    meta: Mapping[str, Any]
    size: int
    dtype: torch.dtype
    ctx: CodecContext | None = None

    def tensor(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The tensor ``name``, refused unless it has ``shape`` and ``dtype``."""
        return expect_tensor(self.tensors, name, shape, dtype)


class WireCodec:
    """The decode side codecs share: refuse an update whose header names another
    codec or that carries tensors other than ``sends``, then ``rebuild`` the delta."""

    name: str
    sends: frozenset[str]  # the names of the tensors ``encode`` gives

    def decode(
        self,
        tensors: Mapping[str, torch.Tensor],
        meta: Mapping[str, Any],
        size: int,
        dtype: torch.dtype,
        ctx: CodecContext | None = None,
    ) -> torch.Tensor:
        expect_codec(meta, self.name, tensors, self.sends)
        return self.rebuild(Received(tensors, meta, size, dtype, ctx))

    def rebuild(self, got: Received) -> torch.Tensor:
        """The ``[size]`` delta of a checked update; UploadError if it is malformed."""
        raise NotImplementedError


class Dense(WireCodec):
    """The delta as it is, in the run's dtype (float32: 4 bytes a parameter)."""

    name = "dense"
    sends = frozenset({"delta"})
    linear = True
    lossy = False
    constraints = ()  # fits any pipeline

    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded:
        return {"delta": delta}, {}

    def rebuild(self, got: Received) -> torch.Tensor:
        return got.tensor("delta", (got.size,), got.dtype)

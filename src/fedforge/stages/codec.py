"""Codecs: how a delta becomes the tensors of an update message and back.

A codec is the client's last stage and the server's first: ``encode`` gives
the named tensors (and metadata) the wire format carries, ``decode`` rebuilds
the ``[P]`` delta and refuses anything malformed with an :class:`UploadError`.
``Dense`` sends the delta as it is; compression codecs (quantisation,
sparsification) implement the same protocol. Runs on both sides; the decode
side trusts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from fedforge.errors import UploadError


class Codec(Protocol):
    """Turns a delta into wire tensors and back."""

    name: str
    linear: bool  # decode(encode(a)) + decode(encode(b)) == decode(encode(a + b))

    def encode(self, delta: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]: ...

    def decode(
        self,
        tensors: Mapping[str, torch.Tensor],
        meta: Mapping[str, Any],
        size: int,
        dtype: torch.dtype,
    ) -> torch.Tensor: ...


def expect_tensor(
    tensors: Mapping[str, torch.Tensor],
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """The tensor ``name`` of an update, refused unless it has ``shape`` and ``dtype``."""
    t = tensors.get(name)
    if t is None:
        raise UploadError(f"update carries no '{name}' tensor (has: {', '.join(tensors) or '-'})")
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise UploadError(
            f"'{name}' has shape {tuple(t.shape)} and dtype {t.dtype}; expected {shape} {dtype}"
        )
    return t


class Dense:
    """The delta as it is, in the run's dtype (float32: 4 bytes a parameter)."""

    name = "dense"
    linear = True

    def encode(self, delta: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {"delta": delta}, {}

    def decode(
        self,
        tensors: Mapping[str, torch.Tensor],
        meta: Mapping[str, Any],
        size: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        return expect_tensor(tensors, "delta", (size,), dtype)

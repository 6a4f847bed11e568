"""Norm clipping of a client's delta: scaled to L2 norm at most ``clip_norm``
(the per-user clipping of McMahan et al. 2018, "Learning
differentially private recurrent language models", on which DP noise builds).

Runs on the client, after local training and before noise and compression;
trusts nothing but its own delta. Under adaptive clipping (Andrew et al. 2021)
the round's clip norm comes from the server and the client reports whether its
delta was left unclipped; in simulation both travel through a :class:`ClipBoard`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedforge.core.errors import ConfigError
from fedforge.pipeline.pipeline import Role, StageContext, Where

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext


class ClipBoard:
    """Adaptive clipping's two messages in simulation: the clip norm of each round
    (server -> clients, with the payload) and each client's bit "my delta was not
    clipped" (client -> server, with the update; summed with noise by the server)."""

    def __init__(self) -> None:
        self.norms: dict[int, float] = {}  # round -> C_t
        self.unclipped: dict[tuple[int, int], int] = {}  # (round, client) -> bit


class Clip:
    """delta * min(1, clip_norm / ||delta||_2)."""

    name = "clip"
    where: Where = "client"
    role: Role = "clip"  # the bound DP noise is calibrated to
    linear = False
    constraints = ()

    def __init__(self, clip_norm: float, board: ClipBoard | None = None) -> None:
        if not clip_norm > 0:
            raise ValueError(f"clip_norm = {clip_norm} must be > 0")
        self.clip_norm = clip_norm
        self.board = board  # adaptive: the round's norm comes from the server

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        norm = float(torch.linalg.vector_norm(vec))
        clip = self.clip_norm
        if self.board is not None:
            clip = self.board.norms.get(ctx.round_idx, clip)
            self.board.unclipped[(ctx.round_idx, ctx.client_id or 0)] = int(norm <= clip)
        if norm <= clip:
            return vec
        return vec * (clip / norm)


def clip_stage(context: ComponentContext) -> Clip:
    """The built-in stage ``clip`` (core/builtins.py): each client's delta clipped
    to ``communication.clip_norm``, placed by that field."""
    norm = context.cfg.communication.clip_norm
    if norm is None:
        raise ConfigError(
            f"stage {context.name!r} clips to communication.clip_norm, which is unset"
        )
    return Clip(norm)

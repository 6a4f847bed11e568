"""Norm clipping of a client's delta: scaled to L2 norm at most ``clip_norm``
(seed 002 2.2.3; the per-user clipping of McMahan et al. 2018, "Learning
differentially private recurrent language models", on which DP noise builds).

Runs on the client, after local training and before noise and compression;
trusts nothing but its own delta.
"""

from __future__ import annotations

import torch

from fedforge.pipeline import StageContext, Where


class Clip:
    """delta * min(1, clip_norm / ||delta||_2)."""

    name = "clip"
    where: Where = "client"
    linear = False

    def __init__(self, clip_norm: float) -> None:
        if not clip_norm > 0:
            raise ValueError(f"clip_norm = {clip_norm} must be > 0")
        self.clip_norm = clip_norm

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        norm = float(torch.linalg.vector_norm(vec))
        if norm <= self.clip_norm:
            return vec
        return vec * (self.clip_norm / norm)

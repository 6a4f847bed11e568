"""Per-layer clipping: a client stage that scales each parameter tensor of a
client's update (a layer's weight, its bias) to L2 norm at most ``norm`` on its
own, so that one layer's large step does not shrink every other layer's, as one
clip of the whole update would (McMahan et al. 2018, "Learning differentially
private recurrent language models", clip per layer this way; here it bounds
each layer's step, not a DP sensitivity).

    fedforge run --plugin examples/layer_clip.py --config examples/layer_clip.yaml

Named in ``pipeline.client``, it runs right after local training, before the
built-in clip, DP noise and the uplink codec. It reads the model's layout from
the factory's ``spec`` (each entry's offset and shape in the flat vector).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import fedforge
from fedforge.config.components import ComponentContext
from fedforge.pipeline.pipeline import StageContext


@dataclass(frozen=True)
class LayerClipOptions:
    norm: float = 1.0  # the largest L2 norm each parameter tensor's update keeps

    def check(self) -> None:
        if not self.norm > 0:
            raise ValueError(f"norm = {self.norm} must be > 0")


class LayerClip:
    name = "layer_clip"
    where = "client"
    role = "other"  # DP noise is calibrated to the built-in clip, not to this one
    linear = False
    constraints = ()

    def __init__(self, norm: float, spans: list[tuple[int, int]]) -> None:
        self.norm, self.spans = norm, spans

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        out = vec.clone()
        for lo, hi in self.spans:
            size = float(torch.linalg.vector_norm(out[lo:hi]))
            if size > self.norm:
                out[lo:hi] *= self.norm / size
        return out


def layer_clip(context: ComponentContext) -> LayerClip:
    assert context.spec is not None  # a stage's factory is given the model's layout
    spans = [(e.offset, e.offset + math.prod(e.shape)) for e in context.spec.entries]
    return LayerClip(context.options.norm, spans)


fedforge.register_stage("layer_clip", layer_clip, options=LayerClipOptions)

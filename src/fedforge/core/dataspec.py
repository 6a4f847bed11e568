"""What a model reads and what it is judged against: the shape and dtype of one
input row and of one label, and the number of classes of integer labels. The data
says it (fedforge.data.federated.FederatedData.spec); model factories read it to
size their first and last layers (fedforge.models.build_model)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DataSpec:
    """One row's input ``input_shape`` of ``input_dtype`` (int64: token ids), its
    label ``label_shape`` (``()``: one class id or value a row; ``(T,)``: one a
    step of a sequence) and ``num_classes`` (None: float regression targets)."""

    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    label_shape: tuple[int, ...]
    num_classes: int | None

    @property
    def input_features(self) -> int:
        """Numbers in one input row (an image's pixels, a vector's entries)."""
        return math.prod(self.input_shape)

    @property
    def outputs(self) -> int:
        """A model's outputs a row (a step): the classes, or the target's values."""
        if self.num_classes is not None:
            return self.num_classes
        return math.prod(self.label_shape)


MNIST_SPEC = DataSpec((1, 28, 28), torch.float32, (), 10)
SYNTHETIC_SPEC = DataSpec((60,), torch.float32, (), 10)  # FedProx's Synthetic(alpha, beta)

PAD = -1  # the label of a sequence step that is padding: no loss, not scored

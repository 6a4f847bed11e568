"""What a model reads and what it is judged against: the shape and dtype of one
input row and of one label, and the number of classes of integer labels. The data
says it (fedforge.data.federated.FederatedData.spec); model factories read it to
size their first and last layers (fedforge.models.build_model)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from fedforge.core.errors import DataError, shown

# the dtypes a spec names on the wire (a deployment's Hello), by name
_DTYPES = {
    str(t).removeprefix("torch."): t
    for t in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64)
}


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

    def to_json(self) -> str:
        """The spec as JSON (what a deployment server tells its clients)."""
        return json.dumps(
            {
                "input_shape": list(self.input_shape),
                "input_dtype": str(self.input_dtype).removeprefix("torch."),
                "label_shape": list(self.label_shape),
                "num_classes": self.num_classes,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> DataSpec:
        """The spec :meth:`to_json` wrote (DataError naming what is malformed)."""
        try:
            d = json.loads(text)
            shapes = [tuple(int(n) for n in d[k]) for k in ("input_shape", "label_shape")]
            dtype = _DTYPES[d["input_dtype"]]
            classes = d["num_classes"]
            if classes is not None and (not isinstance(classes, int) or classes < 1):
                raise ValueError(f"num_classes = {shown(classes)}")
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"a data spec {shown(text)} is malformed: {exc}") from None
        return cls(shapes[0], dtype, shapes[1], classes)


MNIST_SPEC = DataSpec((1, 28, 28), torch.float32, (), 10)
SYNTHETIC_SPEC = DataSpec((60,), torch.float32, (), 10)  # FedProx's Synthetic(alpha, beta)

PAD = -1  # the label of a sequence step that is padding: no loss, not scored

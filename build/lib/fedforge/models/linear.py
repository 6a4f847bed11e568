"""Linear regression: ``outputs`` real values from a row's flattened features, the
model of the regression example task (least squares: its federated optimum on the
whole training set is the ordinary least-squares solution)."""

from __future__ import annotations

import torch
from torch import nn


class LinearRegression(nn.Module):
    """Features ``[B, *shape]`` -> predictions ``[B]`` (``outputs`` = 1) or
    ``[B, outputs]``: one affine map of the flattened row."""

    def __init__(self, in_features: int, outputs: int = 1) -> None:
        super().__init__()
        self.outputs = outputs
        self.fc = nn.Linear(in_features, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x.flatten(start_dim=1))
        return out.squeeze(1) if self.outputs == 1 else out

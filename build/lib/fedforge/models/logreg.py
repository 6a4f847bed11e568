"""Multinomial logistic regression: the convex model of FedProx (Li et al.
2020, section 5.1) for Synthetic(alpha, beta) (60 features) and MNIST (784
pixels): one linear layer, softmax in the loss."""

from __future__ import annotations

import torch
from torch import nn


class LogisticRegression(nn.Module):
    """``in_features`` -> ``num_classes`` logits (images are flattened first)."""

    def __init__(self, in_features: int = 60, num_classes: int = 10) -> None:
        super().__init__()
        self.in_features = in_features
        self.fc = nn.Linear(in_features, num_classes)

    def perceptron_layers(self) -> tuple[str, ...]:
        """Its one layer for the fused perceptron path (models/perceptron.py)."""
        return ("fc",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() >= 3:  # [..., 1, 28, 28] images
            x = x.flatten(start_dim=-3)
        out: torch.Tensor = self.fc(x)
        return out

"""A small MNIST CNN with batch normalisation, for FedBN (Li et al. 2021,
"FedBN: Federated Learning on Non-IID Features via Local Batch Normalization").

conv3x3(16)-BN-ReLU-pool, conv3x3(32)-BN-ReLU-pool, fc(128)-ReLU, fc(10):
small enough for tests and laptop runs. The paper's network is larger and also
normalises its hidden fully connected layers; here only the convolutions are,
so that a minibatch of one example (the last of an epoch) still trains:
BatchNorm1d refuses a batch of one, BatchNorm2d has H x W values per channel.
"""

from __future__ import annotations

import torch
from torch import nn

from fedforge.models.layout import Conv2d


class MnistCNNBN(nn.Module):
    """Two 3x3 convolutions, each followed by batch norm (affine, running
    statistics with momentum 0.1), and two fully connected layers."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = Conv2d(1, 16, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = Conv2d(16, 32, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        x = torch.relu(self.fc1(x.flatten(start_dim=1)))
        out: torch.Tensor = self.fc2(x)
        return out

"""The MNIST models of McMahan et al. 2017, section 3 ("Experimental Results").

2NN: a multilayer perceptron with 2 hidden layers of 200 units, ReLU
(199,210 parameters). CNN: two 5x5 convolutions (32 then 64 channels, same
padding), each followed by 2x2 max pooling, a fully connected layer of 512
units with ReLU and a linear output (1,663,370 parameters).
"""

from __future__ import annotations

import torch
from torch import nn

from fedforge.models.kernels import CNN_KERNEL
from fedforge.models.layout import Conv2d


class MnistMLP(nn.Module):
    """McMahan's "2NN": 784-200-200-10 with ReLU."""

    def __init__(self, hidden: int = 200, num_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def perceptron_layers(self) -> tuple[str, ...]:
        """Its layers for the fused perceptron path (models/perceptron.py)."""
        return ("fc1", "fc2", "fc3")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(start_dim=-3)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        out: torch.Tensor = self.fc3(x)
        return out


class MnistCNN(nn.Module):
    """McMahan's CNN: conv5x5(32)-pool-conv5x5(64)-pool-fc512-fc10."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = Conv2d(1, 32, kernel_size=5, padding=2)
        self.conv2 = Conv2d(32, 64, kernel_size=5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def fused_kernel(self) -> str:
        """The written-out training step that computes this model's SGD step
        (client/cnn_step.py): a promise that its forward is the one below."""
        return CNN_KERNEL

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Pooling before the ReLU: the same numbers (ReLU is monotone, so it
        # commutes with a max; the gradients agree too, bit for bit), on a
        # quarter of the elements.
        x = torch.relu(nn.functional.max_pool2d(self.conv1(x), 2))
        x = torch.relu(nn.functional.max_pool2d(self.conv2(x), 2))
        x = torch.relu(self.fc1(x.flatten(start_dim=1)))
        out: torch.Tensor = self.fc2(x)
        return out

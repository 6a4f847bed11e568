"""The regression example: noisy linear data, ``y = x . w* + b* + noise``, features
``x ~ N(0, I)`` of :data:`FEATURES` dimensions; ``w*``, ``b*`` and the noise drawn
from the run's seed. Its least-squares solution over the training rows is what a
federation of linear models converges to (every client's loss is a quadratic)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedforge.core.rng import numpy_rng

FEATURES = 20
ROWS_PER_CLIENT = 200  # training rows a client holds on average
TEST_ROWS = 2000
NOISE = 0.1  # standard deviation of the targets' noise


@dataclass(frozen=True)
class LinearData:
    """Training and test rows (float64) and the true coefficients."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    weight: torch.Tensor
    bias: float


def generate(num_clients: int, seed: int) -> LinearData:
    """``ROWS_PER_CLIENT x num_clients`` training rows and ``TEST_ROWS`` test rows."""
    rng = numpy_rng(seed, "regression")
    weight = rng.normal(0.0, 1.0, FEATURES)
    bias = float(rng.normal(0.0, 1.0))

    def rows(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = rng.normal(0.0, 1.0, (n, FEATURES))
        y = x @ weight + bias + rng.normal(0.0, NOISE, n)
        return torch.from_numpy(x), torch.from_numpy(y)

    train_x, train_y = rows(ROWS_PER_CLIENT * num_clients)
    test_x, test_y = rows(TEST_ROWS)
    return LinearData(train_x, train_y, test_x, test_y, torch.from_numpy(weight), bias)


def least_squares(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The ordinary least-squares (weight, bias) of ``y`` on ``x`` (float64)."""
    design = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], dim=1)
    solution = torch.linalg.lstsq(design, y.double().unsqueeze(1)).solution.squeeze(1)
    return solution[:-1], float(solution[-1])

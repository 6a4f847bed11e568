"""Model registry: build a model by the name used in configs."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedforge.errors import ConfigError
from fedforge.models.bn import MnistCNNBN
from fedforge.models.logreg import LogisticRegression
from fedforge.models.mnist import MnistCNN, MnistMLP

MODELS: dict[str, Callable[[], nn.Module]] = {
    "2nn": MnistMLP,
    "cnn": MnistCNN,
    "cnn_bn": MnistCNNBN,
    "logreg": LogisticRegression,
}
INPUT_FEATURES = {"mnist": 28 * 28, "synthetic": 60}  # logreg's inputs per data set


def build_model(
    name: str, seed: int, dtype: torch.dtype = torch.float32, dataset: str = "mnist"
) -> nn.Module:
    """A freshly initialised model for ``dataset``; the initial weights depend only
    on ``seed``."""
    if name not in MODELS:
        raise ConfigError(f"model {name!r} is unknown; known models: {', '.join(MODELS)}")
    from fedforge.rng import derive_seed

    # nn.Module initialisers draw from the global generator; fork it so the
    # caller's RNG state is untouched and the init is a function of the seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "model-init"))
        model = LogisticRegression(INPUT_FEATURES[dataset]) if name == "logreg" else MODELS[name]()
    return model.to(dtype)


__all__ = ["MODELS", "LogisticRegression", "MnistCNN", "MnistCNNBN", "MnistMLP", "build_model"]

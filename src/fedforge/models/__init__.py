"""Model registry: build a model by the name used in configs. Besides the four
built in, a caller registers its own (:func:`register_model`) before it builds,
runs or resumes a config naming it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedforge.core.errors import ConfigError
from fedforge.models.bn import MnistCNNBN
from fedforge.models.logreg import LogisticRegression
from fedforge.models.mnist import MnistCNN, MnistMLP

MODELS: dict[str, Callable[[], nn.Module]] = {
    "2nn": MnistMLP,
    "cnn": MnistCNN,
    "cnn_bn": MnistCNNBN,
    "logreg": LogisticRegression,
}
BUILT_IN = frozenset(MODELS)
INPUT_FEATURES = {"mnist": 28 * 28, "synthetic": 60}  # logreg's inputs per data set


def register_model(name: str, factory: Callable[[], nn.Module]) -> None:
    """Make ``model: name`` build ``factory()``, a classifier of the data set's 10
    classes (logits ``[B, 10]``). Its initial weights are drawn under the run's
    seed, as the built-in models' are; registering a name again replaces it."""
    if not isinstance(name, str) or not name.strip() or name in BUILT_IN:
        raise ConfigError(
            f"model name {name!r} cannot be registered: a non-empty name other than the "
            f"built-in {', '.join(sorted(BUILT_IN))}"
        )
    if not callable(factory):
        raise ConfigError(f"model {name!r}: the factory {factory!r} is not callable")
    MODELS[name] = factory


def build_model(
    name: str, seed: int, dtype: torch.dtype = torch.float32, dataset: str = "mnist"
) -> nn.Module:
    """A freshly initialised model for ``dataset``; the initial weights depend only
    on ``seed``."""
    if name not in MODELS:
        raise ConfigError(
            f"model {name!r} is unknown; known models: {', '.join(MODELS)} (your own: "
            "fedforge.register_model(name, factory) before the run, and before its resume)"
        )
    from fedforge.core.rng import derive_seed

    # nn.Module initialisers draw from the global generator; fork it so the
    # caller's RNG state is untouched and the init is a function of the seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "model-init"))
        model = LogisticRegression(INPUT_FEATURES[dataset]) if name == "logreg" else MODELS[name]()
    if not isinstance(model, nn.Module):
        got = type(model).__name__
        raise ConfigError(f"model {name!r}: its factory returned {got}, not a Module")
    return model.to(dtype)


__all__ = [
    "BUILT_IN",
    "MODELS",
    "LogisticRegression",
    "MnistCNN",
    "MnistCNNBN",
    "MnistMLP",
    "build_model",
    "register_model",
]

"""Model registry: build a model by the name used in configs. The built-in ones
are sized by the data (its :class:`DataSpec`): every one by its classes, ``logreg``
and ``linear`` by its input features too; the MNIST models take 28x28 images
alone, and data of another shape is refused by name before any forward pass.
Besides them, a caller registers its own (:func:`register_model`) before it
builds, runs or resumes a config naming it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedforge.core import registry
from fedforge.core.dataspec import MNIST_SPEC, SYNTHETIC_SPEC, DataSpec
from fedforge.core.errors import ConfigError, DataError
from fedforge.models.bn import MnistCNNBN
from fedforge.models.char_lstm import CharLSTM
from fedforge.models.linear import LinearRegression
from fedforge.models.logreg import LogisticRegression
from fedforge.models.mnist import MnistCNN, MnistMLP

# built-in models, sized by the data they train on
SIZED: dict[str, Callable[[DataSpec], nn.Module]] = {
    "2nn": lambda d: MnistMLP(num_classes=d.outputs),
    "cnn": lambda d: MnistCNN(num_classes=d.outputs),
    "cnn_bn": lambda d: MnistCNNBN(num_classes=d.outputs),
    "logreg": lambda d: LogisticRegression(d.input_features, d.outputs),
    "char_lstm": lambda d: CharLSTM(d.outputs),
    "linear": lambda d: LinearRegression(d.input_features, d.outputs),
}
# the built-in models that take rows of one shape alone (the others: any shape)
FIXED_INPUT: dict[str, tuple[int, ...]] = {name: (1, 28, 28) for name in ("2nn", "cnn", "cnn_bn")}
# a caller's models (register_model), in the registry: built by calling them with no argument
MODELS = registry.view("model")
BUILT_IN = frozenset(SIZED)
SPECS = {"mnist": MNIST_SPEC, "synthetic": SYNTHETIC_SPEC}  # of the image/vector data sets


def register_model(name: str, factory: Callable[[], nn.Module]) -> None:
    """Make ``model: name`` build ``factory()``, whose outputs fit the run's task (a
    classifier of MNIST: logits ``[B, 10]``). Its initial weights are drawn under the run's
    seed, as the built-in models' are; registering a name again replaces it."""
    if not isinstance(name, str) or not name.strip() or name in BUILT_IN:
        raise ConfigError(
            f"model name {name!r} cannot be registered: a non-empty name other than the "
            f"built-in {', '.join(sorted(BUILT_IN))}"
        )
    if not callable(factory):
        raise ConfigError(f"model {name!r}: the factory {factory!r} is not callable")
    MODELS[name] = factory


def check_model_name(name: str) -> None:
    """Refuse in one line a model name neither built in nor registered."""
    if name not in SIZED and name not in MODELS:
        raise ConfigError(
            f"model {name!r} is unknown; known models: {', '.join([*SIZED, *MODELS])} (your "
            "own: fedforge.register_model(name, factory) before the run, and before its resume)"
        )


def build_model(
    name: str, seed: int, dtype: torch.dtype = torch.float32, data: DataSpec | str = "mnist"
) -> nn.Module:
    """A freshly initialised model for ``data`` (its spec, or the name of a built-in
    image/vector data set); the initial weights depend only on ``seed``."""
    check_model_name(name)
    spec = SPECS[data] if isinstance(data, str) else data
    want = FIXED_INPUT.get(name)
    if want is not None and spec.input_shape != want:
        raise DataError(
            f"train_x rows of shape {spec.input_shape} do not fit model {name!r}: it takes "
            f"rows of shape {want} (28x28 images); use 'logreg' (sized by the inputs) or a "
            "model of your own (fedforge.register_model)"
        )
    make = (lambda: SIZED[name](spec)) if name in SIZED else MODELS[name]
    return seeded(make, seed, dtype, repr(name))


def seeded(make: Callable[[], nn.Module], seed: int, dtype: torch.dtype, what: str) -> nn.Module:
    """``make()`` with its initial weights drawn under ``seed`` alone, in ``dtype``
    (``what``: the model as an error names it)."""
    from fedforge.core.rng import derive_seed

    # nn.Module initialisers draw from the global generator; fork it so the
    # caller's RNG state is untouched and the init is a function of the seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "model-init"))
        model = make()
    if not isinstance(model, nn.Module):
        got = type(model).__name__
        raise ConfigError(f"model {what}: its factory returned {got}, not a Module")
    return model.to(dtype)


__all__ = [
    "BUILT_IN",
    "MODELS",
    "SIZED",
    "CharLSTM",
    "DataSpec",
    "LinearRegression",
    "LogisticRegression",
    "MnistCNN",
    "MnistCNNBN",
    "MnistMLP",
    "build_model",
    "register_model",
    "seeded",
]

"""Models by the name a config gives, all found in the one registry
(core/registry.py): the built-in ones (registered in core/builtins.py, their
factories in ``builtin.py``) and a caller's own (:func:`register_model`,
registered before it builds, runs or resumes a config naming one). A factory
takes nothing or a :class:`ModelContext` (the data's :class:`DataSpec`), as
``factory.py`` says; every built-in model is sized by the data so."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedforge.core import registry
from fedforge.core.dataspec import MNIST_SPEC, SYNTHETIC_SPEC, DataSpec
from fedforge.core.errors import ConfigError
from fedforge.models.bn import MnistCNNBN
from fedforge.models.char_lstm import CharLSTM
from fedforge.models.factory import ModelContext, call_factory, needs_input
from fedforge.models.linear import LinearRegression
from fedforge.models.logreg import LogisticRegression
from fedforge.models.mnist import MnistCNN, MnistMLP

# every model by name, the built-ins' and a caller's, as a mapping: name -> factory
MODELS = registry.view("model")
SPECS = {"mnist": MNIST_SPEC, "synthetic": SYNTHETIC_SPEC}  # of the image/vector data sets
ModelFactory = Callable[[], nn.Module] | Callable[[ModelContext], nn.Module]


def register_model(name: str, factory: ModelFactory, *, replace: bool = False) -> None:
    """Make ``model: name`` build ``factory()``, or ``factory(context)`` for a factory
    of one argument, a :class:`ModelContext` (the run's data spec: a model sized by
    the data). Its outputs fit the run's task (a classifier of MNIST: logits
    ``[B, 10]``); its initial weights are drawn under the run's seed, as the built-in
    models' are. Registering a name of your own again replaces it; a built-in name
    only with ``replace=True``."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"model name {name!r} cannot be registered: give a non-empty name")
    if registry.is_builtin("model", name) and not replace:
        builtin = [n for n in registry.names("model") if registry.is_builtin("model", n)]
        raise ConfigError(
            f"model name {name!r} cannot be registered: it is a built-in model "
            f"({', '.join(builtin)}); pass replace=True to replace it"
        )
    if not callable(factory):
        raise ConfigError(f"model {name!r}: the factory {factory!r} is not callable")
    registry.register("model", name, factory, replace=True)


def check_model_name(name: str) -> None:
    """Refuse in one line a model name no one registered (built-in or a caller's)."""
    if not registry.is_registered("model", name):
        raise ConfigError(
            f"model {name!r} is unknown; known models: {', '.join(registry.names('model'))} "
            "(your own: fedforge.register_model(name, factory) before the run, and before "
            "its resume)"
        )


def build_model(
    name: str, seed: int, dtype: torch.dtype = torch.float32, data: DataSpec | str = "mnist"
) -> nn.Module:
    """A freshly initialised model ``name`` (found in the registry) for ``data`` (its
    spec, or the name of a built-in image/vector data set); the initial weights
    depend only on ``seed``."""
    check_model_name(name)
    context = ModelContext(name, SPECS[data] if isinstance(data, str) else data)
    factory = registry.lookup("model", name).load()
    return seeded(lambda: call_factory(factory, context), seed, dtype, repr(name))


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
    "MODELS",
    "CharLSTM",
    "DataSpec",
    "LinearRegression",
    "LogisticRegression",
    "MnistCNN",
    "MnistCNNBN",
    "MnistMLP",
    "ModelContext",
    "build_model",
    "needs_input",
    "register_model",
    "seeded",
]

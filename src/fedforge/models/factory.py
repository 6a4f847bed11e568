"""The contract of a model factory, the built-ins' and a plugin's alike.

A model factory is registered under a name (``fedforge.register_model``, or
``fedforge.register("model", ...)``) and called when a run builds that model,
under the run's seed, in one of two shapes, told apart by its signature:

- no argument (``factory()``): a model of fixed shapes, e.g. ``TinyCNN`` for
  MNIST's ``[B, 1, 28, 28]`` rows and 10 classes;
- one argument, a :class:`ModelContext`: a model sized by the data it trains on
  (``context.data``: its :class:`DataSpec`, the input shape and the classes or
  target values), as every built-in model is. :func:`needs_input` refuses, in
  one line naming the model, data whose rows the model cannot take.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from fedforge.core.dataspec import DataSpec
from fedforge.core.errors import ConfigError, DataError


@dataclass(frozen=True)
class ModelContext:
    """What a sized model's factory is called with: the name the config gave
    (one factory may serve several names) and the spec of the run's data."""

    name: str
    data: DataSpec


def takes_context(factory: Callable[..., object]) -> bool:
    """Whether ``factory`` is called with a :class:`ModelContext` (it has one
    parameter without a default) rather than with nothing (it has none)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a built-in callable: no signature to read
        return False
    required = [
        p
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        raise ConfigError(
            f"model factory {getattr(factory, '__name__', factory)!r} takes "
            f"{len(required)} arguments; it must take none or one (a ModelContext)"
        )
    return len(required) == 1


def call_factory(factory: Callable[..., nn.Module], context: ModelContext) -> nn.Module:
    """The model ``factory`` makes, called in its shape (see the module docstring)."""
    return factory(context) if takes_context(factory) else factory()


def needs_input(context: ModelContext, shape: tuple[int, ...], what: str) -> None:
    """Refuse data whose rows are not of ``shape`` (``what``: the rows the model
    takes, in words), in one line naming the model."""
    if context.data.input_shape != shape:
        raise DataError(
            f"train_x rows of shape {context.data.input_shape} do not fit model "
            f"{context.name!r}: it takes rows of shape {shape} ({what}); use 'logreg' (sized "
            "by the inputs) or a model of your own (fedforge.register_model)"
        )

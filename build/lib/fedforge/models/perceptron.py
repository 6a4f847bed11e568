"""What a model declares to take the engines' fused perceptron path: that it is
a chain of linear layers with ReLU between each pair.

A model with a ``perceptron_layers()`` method returning the names of its
``nn.Linear`` submodules in order promises that its forward is

    logits = L_n(relu(... relu(L_1(x.flatten per example)) ...))

with every layer's weight and bias its only parameters. The McMahan 2NN and
multinomial logistic regression declare it; any model may.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torch import nn


class Perceptron(Protocol):
    """A model that declares itself a chain of linear layers with ReLU between them."""

    def perceptron_layers(self) -> Sequence[str]: ...


def perceptron_layers(model: nn.Module) -> list[str] | None:
    """The linear layers ``model`` declares, in order (None: it declares none,
    or the declaration does not match its modules: a named module that is not
    a biased ``nn.Linear``, or a parameter outside the declared layers)."""
    declare = getattr(model, "perceptron_layers", None)
    if declare is None:
        return None
    layers = list(declare())
    modules = dict(model.named_modules())
    if not layers or any(
        not isinstance(modules.get(name), nn.Linear) or modules[name].bias is None
        for name in layers
    ):
        return None
    declared = {f"{name}.{kind}" for name in layers for kind in ("weight", "bias")}
    if {name for name, _ in model.named_parameters()} != declared:
        return None
    return layers

"""The built-in models' factories, registered by name in core/builtins.py as a
plugin registers its own: each takes a :class:`ModelContext` and sizes the
model by the run's data (its classes; ``logreg`` and ``linear`` its input
features too). The MNIST models take 28x28 images alone."""

from __future__ import annotations

from torch import nn

from fedforge.models.bn import MnistCNNBN
from fedforge.models.char_lstm import CharLSTM
from fedforge.models.factory import ModelContext, needs_input
from fedforge.models.linear import LinearRegression
from fedforge.models.logreg import LogisticRegression
from fedforge.models.mnist import MnistCNN, MnistMLP

IMAGE = (1, 28, 28)  # the rows the MNIST models take


def mlp(context: ModelContext) -> nn.Module:
    """``2nn``: two hidden layers of 200 (McMahan et al. 2017)."""
    needs_input(context, IMAGE, "28x28 images")
    return MnistMLP(num_classes=context.data.outputs)


def cnn(context: ModelContext) -> nn.Module:
    """``cnn``: two 5x5 convolutions, a dense layer of 512 (McMahan et al. 2017)."""
    needs_input(context, IMAGE, "28x28 images")
    return MnistCNN(num_classes=context.data.outputs)


def cnn_bn(context: ModelContext) -> nn.Module:
    """``cnn_bn``: the CNN with batch norm (FedBN's model)."""
    needs_input(context, IMAGE, "28x28 images")
    return MnistCNNBN(num_classes=context.data.outputs)


def logreg(context: ModelContext) -> nn.Module:
    """``logreg``: multinomial logistic regression over the flattened inputs."""
    return LogisticRegression(context.data.input_features, context.data.outputs)


def char_lstm(context: ModelContext) -> nn.Module:
    """``char_lstm``: the Shakespeare character model (its vocabulary: the classes)."""
    return CharLSTM(context.data.outputs)


def linear(context: ModelContext) -> nn.Module:
    """``linear``: linear regression to the targets' values."""
    return LinearRegression(context.data.input_features, context.data.outputs)

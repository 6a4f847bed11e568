"""Where local training and evaluation run: the config's ``device``.

``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (``cuda`` when torch sees a GPU, else
``cpu``). The name is checked with the config (:func:`is_device_name`); whether
the machine has that device is checked where the run is built
(:func:`resolve_device`), so a stored config stays readable on any machine.

On the device: the model, the flat parameters a client trains from and its
minibatches, and evaluation's batches. On the host (CPU): the flat global
vector, aggregation, the pipeline's stages, checkpoints and the run store; a
client's trained parameters come back to the host before its upload pipeline.
Code that runs a model runs it where the model is (:func:`module_device`).
"""

from __future__ import annotations

import itertools
import re

import torch
from torch import nn

from fedforge.core.errors import invalid_field

HOST = torch.device("cpu")
DEVICE_NAMES = "'cpu', 'cuda', 'cuda:N' (N an integer >= 0) or 'auto'"
_CUDA_INDEX = re.compile(r"cuda:[0-9]+")
_FIX = "set device: cpu, or device: auto (cuda when torch sees a GPU, else cpu)"


def is_device_name(value: object) -> bool:
    """Whether ``value`` names a device a config may ask for."""
    if not isinstance(value, str):
        return False
    return value in ("cpu", "cuda", "auto") or _CUDA_INDEX.fullmatch(value) is not None


def resolve_device(name: str) -> torch.device:
    """The device ``name`` stands for on this machine; a ConfigError in one line
    when it asks for CUDA that torch cannot use here."""
    if name == "cpu":
        return HOST
    if name == "auto":
        return (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else HOST
        )
    if not torch.cuda.is_available():
        raise invalid_field("device", name, f"{_no_cuda()}; {_FIX}")
    count = torch.cuda.device_count()
    index = int(name.split(":")[1]) if ":" in name else torch.cuda.current_device()
    if index >= count:
        seen = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        raise invalid_field(
            "device",
            name,
            f"torch sees {count} CUDA device{'s' if count != 1 else ''} ({seen}); name "
            f"one of them, or {_FIX}",
        )
    return torch.device("cuda", index)


def _no_cuda() -> str:
    """Why CUDA cannot be used here, naming torch's build."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (no CUDA)"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device here"


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s tensors (its first parameter's or buffer's;
    the host for a module without any): where code that runs it computes."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    return HOST

"""ParamSpec: a model's tensors as one flat vector and back (DESIGN idea 1).

Every parameter and buffer of a module gets a slot ``[offset, offset + numel)`` in
a flat vector and a kind (``weight``, ``batchnorm``, ``buffer``). Clipping, noise,
compression and averaging are then plain vector maths, and a cohort's updates
are one ``[K, P]`` tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

ParamKind = Literal["weight", "batchnorm", "buffer"]

_BN_TYPES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)


@dataclass(frozen=True)
class ParamEntry:
    """One tensor's place in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int
    kind: ParamKind
    frozen: bool = False  # a parameter with requires_grad False: it never moves

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def slice(self) -> slice:
        return slice(self.offset, self.offset + self.numel)

    @property
    def trainable(self) -> bool:
        """A parameter that gradients move (buffers such as batch-norm running
        statistics are updated by the forward pass instead; a frozen parameter,
        ``requires_grad`` False, stays as ``torch.optim.SGD`` would leave it)."""
        return self.kind != "buffer" and not self.frozen


@dataclass(frozen=True)
class ParamSpec:
    """The layout of a module's trainable parameters (and optionally its buffers)."""

    entries: tuple[ParamEntry, ...]

    @staticmethod
    def of(module: nn.Module, include_buffers: bool = False) -> ParamSpec:
        """The spec of ``module``: its parameters in ``named_parameters`` order, then
        (if asked) its floating-point buffers."""
        for prefix, sub in module.named_modules():
            if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.momentum is None:
                raise ValueError(
                    f"batch norm '{prefix}' has momentum=None (a cumulative average over "
                    "num_batches_tracked, a counter the flat vector does not carry per "
                    "client); give it a float momentum, e.g. 0.1"
                )
        norm_names = {
            f"{prefix}.{n}" if prefix else n
            for prefix, sub in module.named_modules()
            if isinstance(sub, _BN_TYPES)
            for n, _ in sub.named_parameters(recurse=False)
        }
        entries: list[ParamEntry] = []
        offset = 0
        for name, p in module.named_parameters():
            kind: ParamKind = "batchnorm" if name in norm_names else "weight"
            entries.append(ParamEntry(name, tuple(p.shape), offset, kind, not p.requires_grad))
            offset += p.numel()
        if include_buffers:
            for name, b in module.named_buffers():
                if b.is_floating_point():
                    entries.append(ParamEntry(name, tuple(b.shape), offset, "buffer"))
                    offset += b.numel()
        return ParamSpec(tuple(entries))

    @property
    def size(self) -> int:
        """P, the length of the flat vector."""
        return sum(e.numel for e in self.entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    def flatten(self, module: nn.Module, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A new flat vector holding ``module``'s current values, in ``dtype``
        (default: the module's first parameter's)."""
        tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
        tensors.update(dict(module.named_buffers()))
        if dtype is None:
            dtype = tensors[self.entries[0].name].dtype if self.entries else torch.float32
        out = torch.empty(self.size, dtype=dtype)
        for e in self.entries:
            out[e.slice].copy_(tensors[e.name].detach().reshape(-1))
        return out

    def views(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        """Zero-copy named views of ``vec`` (shape ``[P]``) or of each row of a
        batched ``[..., P]`` tensor, shaped like the module's tensors."""
        self._check(vec)
        lead = tuple(vec.shape[:-1])
        return {e.name: vec[..., e.slice].view(*lead, *e.shape) for e in self.entries}

    def load_into(self, module: nn.Module, vec: torch.Tensor) -> None:
        """Copy ``vec`` into ``module``'s tensors in place."""
        self._check(vec)
        tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
        tensors.update(dict(module.named_buffers()))
        with torch.no_grad():
            for name, view in self.views(vec).items():
                tensors[name].copy_(view)

    def mask(self, kinds: tuple[ParamKind, ...]) -> torch.Tensor:
        """A boolean ``[P]`` mask of the entries whose kind is in ``kinds``."""
        out = torch.zeros(self.size, dtype=torch.bool)
        for e in self.entries:
            if e.kind in kinds:
                out[e.slice] = True
        return out

    def frozen_mask(self) -> torch.Tensor | None:
        """A boolean ``[P]`` mask of the frozen parameters' entries (None: none)."""
        if not any(e.frozen for e in self.entries):
            return None
        out = torch.zeros(self.size, dtype=torch.bool)
        for e in self.entries:
            if e.frozen:
                out[e.slice] = True
        return out

    def _check(self, vec: torch.Tensor) -> None:
        if vec.shape[-1] != self.size:
            raise ValueError(f"flat vector has {vec.shape[-1]} entries; the spec needs {self.size}")


def all_finite(t: torch.Tensor) -> bool:
    """Whether every number of ``t`` is finite (no NaN, no +-inf): its minimum and
    maximum are, since both propagate a NaN. One pass, against the four of
    ``torch.isfinite(t).all()`` (composite here: 0.40 ms against 0.02 ms for the
    2NN's 199,210 floats, one thread); the same answer for every float and
    complex dtype (integers are finite)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.numel() == 0 or not t.dtype.is_floating_point:
        return True
    lo, hi = torch.aminmax(t)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))

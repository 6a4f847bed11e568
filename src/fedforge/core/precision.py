"""Mixed precision for local training (``precision: bf16``).

Local training's forward pass runs under autocast to bfloat16, the device's
(matrix products and convolutions in bf16, reductions and the loss in fp32); the
parameters, their gradients, the optimizer state, the update, aggregation and
evaluation stay in fp32 (the "fp32 master weights" recipe of Micikevicius et
al. 2018, "Mixed Precision Training", with bf16 needing no loss scaling).

On the CPU, bf16 pays only on CPUs that compute it natively (AMX or
AVX512-BF16); elsewhere oneDNN emulates it and it is slower than fp32 (measured
on an AVX512 CPU without either: 0.5x; with AVX512-BF16, 1.3x for the CNN's
clients at B = 10 and 1.7x at B = 100: docs/changelog.md). :func:`native_bf16`
tells which, and a CPU run says so in one line when bf16 is asked for without it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch


def forward_context(
    precision: str, device_type: str = "cpu"
) -> contextlib.AbstractContextManager[object]:
    """The context a local training forward pass runs in, on a device of
    ``device_type`` (autocast is per device type: CPU autocast leaves CUDA
    kernels in fp32)."""
    if precision == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def native_bf16() -> bool:
    """True if this CPU computes bf16 natively (AMX tiles or AVX512-BF16)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return torch.backends.cpu.get_cpu_capability() == "AMX"
    return " amx_bf16" in flags or " avx512_bf16" in flags


def precision_note(precision: str) -> str | None:
    """One line for a run that asks for bf16 on a CPU without native bf16."""
    if precision == "bf16" and not native_bf16():
        return (
            "precision bf16: this CPU has no AMX or AVX512-BF16, bf16 is emulated "
            "and slower than fp32 here"
        )
    return None

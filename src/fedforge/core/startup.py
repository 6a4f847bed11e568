"""How a fedforge process imports torch: once, and ready for a long life."""

from __future__ import annotations

import gc
import sys


def load_torch() -> None:
    """Import torch, and when this process's torch is fedforge's to start (not yet
    imported by the caller), freeze the ~170k objects it leaves: every full
    collection of the cyclic garbage collector would rescan them (one such
    collection cost 75 ms of the command's start-up here). Reference counting
    still frees them; they live as long as the process anyway."""
    if "torch" not in sys.modules:
        import torch  # noqa: F401

        gc.freeze()

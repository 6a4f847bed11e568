"""The C allocator's settings for training: keep large blocks in the heap.

glibc's malloc serves every block above its mmap threshold (adjusted on the
fly, never above 32 MiB) with a fresh ``mmap`` and hands it back to the kernel
on ``free``; the next allocation of that size maps new pages, which the kernel
zero-fills on first touch. A training step allocates and frees the same
activation and gradient buffers over and over, so with the defaults a large
share of the CPU time goes to the kernel: measured here (torch 2.13, one
thread, McMahan's CNN) 25% of the CPU time was system time for full-batch
steps of 600 examples (FedSGD, evaluation, the centralized reference), 5% at
B = 10, and about 1% with these settings. Raising the mmap and trim thresholds
keeps freed blocks for reuse; the heap then stays at the run's peak, which it
reaches in the first round anyway.

Not for the largest blocks: a gathered round's ``[K, P]`` updates (760 MB for
1,000 2NN clients) kept in the heap were split by the small blocks allocated
after them, the next round's did not fit in what was left, and the peak grew
by ~450 MiB from the second round on (measured, tests/test_engine_contract_slow.py:
1,672 MiB after 3 rounds against 1,160-1,230 after one; 1,227 after 3 with
this limit). Blocks of 256 MiB and more are mapped and unmapped as glibc
would; a fresh 256 MiB costs ~0.05 s of zero-filling, small beside what fills it.

Applied once per process by :func:`keep_large_blocks` when a run is built (not
on import: importing fedforge does not change a host program's allocator).
``FEDFORGE_MALLOC=default`` leaves the allocator alone. Other C libraries
(macOS, musl) are left alone too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 28  # bytes: blocks under 256 MiB come from the heap
TRIM_THRESHOLD = 1 << 30  # and up to 1 GiB of freed heap stays for reuse

_applied: bool | None = None


def keep_large_blocks() -> bool:
    """Raise glibc's mmap and trim thresholds (once); True if they are in effect."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get("FEDFORGE_MALLOC", "") == "default":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return bool(ok and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)

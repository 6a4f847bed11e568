"""fedforge.core.allocator: after keep_large_blocks, a freed large block stays in the
heap for reuse instead of going back to the kernel (glibc only)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

CHILD = """
import ctypes, json, sys
import torch
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = None
if sys.argv[1] == "tuned":
    from fedforge.core.allocator import keep_large_blocks
    applied = keep_large_blocks()
block = torch.empty(100 * 2**20, dtype=torch.uint8)
block.fill_(1)
mapped = libc.mallinfo2().hblkhd  # bytes in mmap-ed blocks while the block lives
del block
free_in_heap = libc.mallinfo2().fordblks  # freed bytes the heap keeps for reuse
print(json.dumps({"applied": applied, "mapped": mapped, "free_in_heap": free_in_heap}))
"""

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)


def _child(mode: str, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_default_allocator_maps_and_returns_a_100_mib_block() -> None:
    plain = _child("plain")
    assert plain["mapped"] >= 100 * 2**20
    assert plain["free_in_heap"] < 100 * 2**20


@glibc
def test_keep_large_blocks_serves_a_100_mib_block_from_the_heap_and_keeps_it() -> None:
    tuned = _child("tuned")
    assert tuned["applied"] is True
    assert tuned["mapped"] < 100 * 2**20
    assert tuned["free_in_heap"] >= 100 * 2**20


@glibc
def test_fedforge_malloc_default_leaves_the_allocator_alone() -> None:
    tuned = _child("tuned", FEDFORGE_MALLOC="default")
    assert tuned["applied"] is False
    assert tuned["mapped"] >= 100 * 2**20

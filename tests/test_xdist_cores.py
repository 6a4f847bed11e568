"""``make test``'s pytest-xdist workers (tests/conftest.py): each keeps itself, and
what it starts, to its own share of the cores this process had before pytest
pinned it, and a test marked ``all_cores`` gets every one of them back. Skipped
when the suite runs in one process or on fewer cores than workers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import conftest

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
SHARE = len(conftest._ALL_CORES) // WORKERS if WORKERS else 0

pytestmark = pytest.mark.skipif(
    WORKERS < 2 or SHARE < 1, reason="runs under make test's pytest-xdist workers"
)


def test_a_worker_and_its_subprocesses_keep_to_their_share_of_the_cores() -> None:
    assert len(os.sched_getaffinity(0)) == SHARE
    assert set(os.sched_getaffinity(0)) < set(conftest._ALL_CORES)
    assert torch.get_num_threads() == SHARE
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(len(os.sched_getaffinity(0)))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert int(child.stdout) == SHARE


@pytest.mark.all_cores
def test_a_test_marked_all_cores_has_every_core_back() -> None:
    assert sorted(os.sched_getaffinity(0)) == conftest._ALL_CORES
    assert torch.get_num_threads() == conftest._ALL_THREADS

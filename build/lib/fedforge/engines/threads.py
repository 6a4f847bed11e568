"""How many torch intra-op threads each process of a run uses.

Torch's default (every core of the machine) oversubscribes a process that shares
its cores with worker processes or other jobs: spinning OpenMP threads that
wait for a core slow a round several times over. A run's processes divide the
cores this process may use (its CPU affinity) among themselves instead: with
``W`` worker processes each gets ``cores // W`` threads; the server process
keeps every core, since its heavy work (evaluation, a gathered aggregate) runs
while the workers wait for the next cohort, and while they train it only
decodes and adds uploads (evaluating the CNN's 10k test images here: 2.5 s on
one thread, 1.3 s on two). A run in one process takes them all. ``threads:``
in the config sets one count for every process of the run instead, and so does
the ``FEDFORGE_THREADS`` environment variable when the config leaves it null.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from fedforge.config.schema import MAX_THREADS
from fedforge.core.errors import ConfigError

THREADS_ENV = "FEDFORGE_THREADS"  # a positive integer: the default in place of the cores'


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ThreadPlan:
    """Torch threads of the server process and of each worker process (``workers``
    of them; 0 when the run has none)."""

    server: int
    worker: int
    workers: int = 0
    cores: int = 1  # the usable cores the plan divided
    configured: bool = False  # set by the config or the environment, not derived

    def describe(self) -> str:
        """The plan in a line of the run's start."""
        how = "as configured" if self.configured else f"of {self.cores} usable cores"
        if self.workers == 0:
            return f"torch threads: {self.server} in this process ({how})"
        return (
            f"torch threads: {self.server} in the server process, {self.worker} in each "
            f"of {self.workers} workers ({how})"
        )


def env_threads() -> int | None:
    """``FEDFORGE_THREADS`` as a count, None when unset; a ConfigError naming it
    when it is not an integer in [1, MAX_THREADS]."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= MAX_THREADS:
        raise ConfigError(
            f"{THREADS_ENV}={text[:40]!r} is invalid: must be an integer in [1, {MAX_THREADS}], "
            "or unset (the usable cores divided among the run's processes)"
        )
    return int(text)


def thread_plan(configured: int | None, cores: int, workers: int = 0) -> ThreadPlan:
    """The threads of a run with ``workers`` worker processes (0: the server alone)
    on ``cores`` cores; ``configured`` (the config's ``threads``, else
    ``FEDFORGE_THREADS``) sets every process's count instead."""
    fixed = configured if configured is not None else env_threads()
    if fixed is not None:
        return ThreadPlan(fixed, fixed if workers else 0, workers, cores, configured=True)
    cores = max(1, cores)
    if workers == 0:
        return ThreadPlan(cores, 0, 0, cores)
    return ThreadPlan(cores, max(1, cores // workers), workers, cores)


def set_threads(count: int) -> int:
    """Set this process's torch intra-op threads; returns the count before."""
    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    return before

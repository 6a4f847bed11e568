"""The ``ray:`` config section: where ``engine: ray`` trains the clients.

The run connects to a Ray cluster (``address``, else the ``RAY_ADDRESS``
environment variable) or starts a local one, and trains its cohort on
``workers`` Ray actors, each reserving ``num_cpus`` CPUs and ``num_gpus`` GPUs
of the cluster (a GPU fraction shares a GPU between workers, as Flower's
client resources do). engines/ray_engine.py says what runs where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fedforge.config.ranges import Most, Range

# retry: a new worker takes the lost one's place and its clients train again
# there (the same uploads: a task's randomness is its seed's); dropout: its
# clients of the round count as dropouts and the round goes on without them.
# A worker holding per-client state ends the round either way (resume the run)
WorkerFailure = Literal["retry", "dropout"]


@dataclass(frozen=True)
class RayConfig:
    """The Ray cluster of ``engine: ray`` and what each of its workers reserves."""

    # ray://host:port or host:port of a running cluster; null: $RAY_ADDRESS, else a
    # local cluster of this machine's cores started by the run
    address: str | None = None
    # Ray actors the cohort is spread over; 0: as many as the cluster's CPUs allow
    # (its CPUs / num_cpus)
    workers: Annotated[
        int, Range(">= 0", note="0: the cluster's CPUs / num_cpus"), Most(4096, "workers")
    ] = 0
    num_cpus: Annotated[float, Range("> 0", note="CPUs a worker reserves")] = 1.0
    num_gpus: Annotated[float, Range(">= 0", note="GPUs a worker reserves; 0.5: half of one")] = 0.0
    on_worker_failure: WorkerFailure = "retry"
    # lost workers replaced over the run (a new actor in the lost one's place)
    max_restarts: Annotated[int, Range(">= 0"), Most(100, "restarts")] = 3
    # each worker sums its clients' updates and sends the driver one weighted sum
    # where the round's aggregation allows it (a mean of plain updates)
    aggregate_on_workers: bool = True

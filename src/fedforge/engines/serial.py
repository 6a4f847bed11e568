"""The serial engine: the reference. Each client of the cohort runs in this
process, one after the other, exactly as a real client would."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence

from fedforge.client.runtime import ClientRuntime, ClientTask, ClientUpload
from fedforge.engines import SimulationEngine


class SerialEngine(SimulationEngine):
    """Calls the client runtime in-process for each task, in cohort order."""

    name = "serial"

    def __init__(self, runtime: ClientRuntime) -> None:
        self.runtime = runtime

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        for task in tasks:
            t0 = time.perf_counter()
            data = self.runtime.run(task, payload)
            yield ClientUpload(task.client_id, data, time.perf_counter() - t0)

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        return self.runtime.run_phase(phase, messages)

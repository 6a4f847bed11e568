"""A process that runs engine: auto's timing of a two-worker pool again and
again, each stopped after its first upload while the workers send results of
several MiB, then exits (tests/test_probe_exit.py runs it with a timeout).

Arguments: repeats, MiB per upload, and optionally how long closing the pool
waits for its running jobs (0: they are killed at once)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence

from tests.conftest import TINY_LOGREG, _make_data

from fedforge import config as config_mod
from fedforge.client.runtime import ClientRuntime, ClientTask, ClientUpload
from fedforge.engines import close_engine, pool
from fedforge.engines.serial import SerialEngine
from fedforge.server import probe
from fedforge.server.experiment import build


class LargeUploads(SerialEngine):
    """Each client's upload is ``size`` zero bytes, sent at once (a large
    model's update, without training one)."""

    def __init__(self, runtime: ClientRuntime, size: int) -> None:
        super().__init__(runtime)
        self.size = size

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        for task in tasks:
            yield ClientUpload(task.client_id, bytes(self.size), 0.0)


def main(repeats: int, mib: int, drain: float | None) -> None:
    cfg = config_mod.from_dict({**TINY_LOGREG, "engine": "serial"})
    exp = build(cfg, _make_data([4, 4, 4, 4]))
    runtime = exp.engine.runtime  # type: ignore[attr-defined]
    close_engine(exp.engine)
    probe.SECONDS = 0.0  # the timing stops at its first upload, the workers still busy
    if drain is not None:
        pool.DRAIN_S = drain

    def make(candidate: probe.Candidate, rt: ClientRuntime) -> pool.PoolEngine:
        return pool.PoolEngine(LargeUploads(rt, mib << 20), candidate.workers)

    for k in range(repeats):
        t0 = time.perf_counter()
        probe._rate(probe.Candidate("serial", 2), runtime, make, 8, 4)
        print(f"probe {k} {time.perf_counter() - t0:.2f} s", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else None)

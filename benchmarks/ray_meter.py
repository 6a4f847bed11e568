"""What benchmarks/ray_engine.py measures of each round, beside the loop's own
record: the clients' training seconds as their workers timed them (by Ray
worker), the driver's time merging the workers' shares, the bytes the driver
puts into Ray's object store and receives back (each returned object pickled,
as Ray serialises it), and the driver's memory (``/proc/self/status``). The
engines are wrapped, never changed: what a round computes is the same."""

from __future__ import annotations

import json
import pickle
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedforge.config import from_dict
from fedforge.engines.pool import PoolEngine
from fedforge.engines.ray_engine import RayEngine
from fedforge.server.collectors.streaming import StreamingMean
from fedforge.server.hooks import RoundEnd, RoundHook, RoundInfo
from fedforge.server.loop import run

WORKERS = 2
EXAMPLES = 60  # per client, N = 1,000


class Meter:
    """What the engines report of the current round (patched in by :func:`instrument`)."""

    client_s = 0.0  # the clients' training seconds, as their workers timed them
    per_worker: dict[int, float] = {}  # the same by Ray worker (the pool's: unknown)
    merge_s = 0.0  # the driver's time adding worker shares into the round's sum
    shares = 0
    back_bytes = 0  # what the driver received from the workers (pickled size)
    put_bytes = 0  # what the driver put into the object store
    count_bytes = False

    @classmethod
    def reset(cls) -> None:
        cls.client_s = cls.merge_s = 0.0
        cls.per_worker = {}
        cls.shares = cls.back_bytes = cls.put_bytes = 0


def instrument() -> None:
    """Wrap the engines' yields and the collector's share merge to feed :class:`Meter`
    (the computation is unchanged; counting bytes pickles what came back)."""

    def uploads(fn: Any) -> Any:
        def wrapped(self: Any, tasks: Any, payload: bytes, *a: Any) -> Iterator[Any]:
            if Meter.count_bytes and isinstance(self, RayEngine):
                Meter.put_bytes += len(payload)
            for up in fn(self, tasks, payload, *a):
                Meter.client_s += up.seconds
                if isinstance(self, RayEngine):
                    w = self.owner(up.client_id)
                    Meter.per_worker[w] = Meter.per_worker.get(w, 0.0) + up.seconds
                yield up

        return wrapped

    def summed(fn: Any) -> Any:
        def wrapped(self: Any, tasks: Any, payload: bytes, summing: Any) -> Iterator[Any]:
            if Meter.count_bytes:
                Meter.put_bytes += len(payload)
            for share in fn(self, tasks, payload, summing):
                seconds = sum(v.seconds for v in share.verdicts)
                Meter.client_s += seconds
                w = self.owner(share.verdicts[0].client_id) if share.verdicts else -1
                Meter.per_worker[w] = Meter.per_worker.get(w, 0.0) + seconds
                yield share

        return wrapped

    def result(fn: Any) -> Any:
        def wrapped(self: Any, call: Any) -> Any:
            value = fn(self, call)
            if Meter.count_bytes and value is not None:
                Meter.back_bytes += len(pickle.dumps(value, protocol=5))
            return value

        return wrapped

    def take(fn: Any) -> Any:
        def wrapped(self: Any, share: Any) -> Any:
            t0 = time.perf_counter()
            got = fn(self, share)
            Meter.merge_s += time.perf_counter() - t0
            Meter.shares += 1
            return got

        return wrapped

    PoolEngine.run_cohort = uploads(PoolEngine.run_cohort)  # type: ignore[method-assign]
    RayEngine.run_cohort = uploads(RayEngine.run_cohort)  # type: ignore[method-assign]
    RayEngine._summed = summed(RayEngine._summed)  # type: ignore[method-assign]
    RayEngine._result = result(RayEngine._result)  # type: ignore[method-assign]
    StreamingMean.take_share = take(StreamingMean.take_share)  # type: ignore[method-assign]


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


class Rounds(RoundHook):
    """Each round's record with the meter's figures; the driver's memory: RSS after
    the warm-up round (then the peak is reset), peak before the last round."""

    name = "bench_rounds"

    def __init__(self, rounds: int, memory: bool = False) -> None:
        self.rounds, self.memory = rounds, memory
        self.rows: list[dict[str, Any]] = []
        self.mem: dict[str, float] = {}
        self.model_size = 0
        self.history_rows = 0
        self.history_bytes = 0

    def round_start(self, info: RoundInfo) -> None:
        Meter.reset()
        if self.memory and info.round_idx == self.rounds - 1:
            self.mem["peak_mib"] = status_kib("VmHWM") / 1024
            self.mem["anon_mib"] = status_kib("RssAnon") / 1024
            self.mem["rss_mib"] = status_kib("VmRSS") / 1024
            history = info.state.selection.state_dict()
            self.history_bytes = len(json.dumps(history))
            self.history_rows = len(info.state.selection.rows)

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        self.model_size = info.exp.spec.size
        self.rows.append(
            {
                "round": info.round_idx,
                "seconds": end.record.seconds,
                "samples": sum(c.num_examples for c in end.clients),
                "client_s": Meter.client_s,
                # the busiest worker's clients (the pool hands clients out as workers
                # free up: taken as an even split)
                "busiest_s": max(Meter.per_worker.values(), default=Meter.client_s / WORKERS),
                "clients_per_share": len(end.arrived) / max(Meter.shares, 1),
                "merge_s": Meter.merge_s,
                "shares": Meter.shares,
                "back_bytes": Meter.back_bytes,
                "put_bytes": Meter.put_bytes,
            }
        )
        if self.memory and info.round_idx == 0:
            self.mem["after_warmup_mib"] = status_kib("VmRSS") / 1024
            Path("/proc/self/clear_refs").write_text("5")  # the peak from here

    def timed(self) -> list[dict[str, Any]]:
        return self.rows[1:-1]


def run_timed(cfg_dict: dict[str, Any], data: Any = None, memory: bool = False) -> dict[str, Any]:
    cfg = from_dict(cfg_dict)
    hook = Rounds(cfg.rounds, memory)
    result = run(cfg, data=data, store=False, hooks=[hook])
    rows = hook.timed()
    workers = WORKERS
    sec = [r["seconds"] for r in rows]
    out = {
        "engine": result.summary["engine"],
        "s_per_round": statistics.mean(sec),
        "samples_per_s": statistics.mean(r["samples"] / r["seconds"] for r in rows),
        "overhead_s": statistics.mean(r["seconds"] - r["client_s"] / workers for r in rows),
        "beyond_busiest_s": statistics.mean(r["seconds"] - r["busiest_s"] for r in rows),
        "clients_per_share": statistics.mean(r["clients_per_share"] for r in rows),
        "client_s_each": statistics.mean(r["client_s"] / max(r["samples"], 1) for r in rows)
        * EXAMPLES,
        "merge_s_per_share": (
            sum(r["merge_s"] for r in rows) / max(1, sum(r["shares"] for r in rows))
        ),
        "shares": statistics.mean(r["shares"] for r in rows),
        "back_bytes": statistics.mean(r["back_bytes"] for r in rows),
        "put_bytes": statistics.mean(r["put_bytes"] for r in rows),
        "model_bytes": hook.model_size * 4,
        "history_rows": hook.history_rows,
        "history_bytes": hook.history_bytes,
        "final": result.params,
        **hook.mem,
    }
    return out

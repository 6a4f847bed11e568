"""``engine: auto`` on this machine: which of the engine configurations a run
may use is the fastest, measured once per machine and model.

Which engine trains a model's clients fastest depends on the CPU more than on
the model: on one AVX2 machine the 2NN's vectorised engine in one process beat
the same engine over two workers, on another it lost (0.58 against 0.80 of
plain PyTorch at K*B). So ``engine: auto`` times each candidate (an inner engine
in this process, or spread over worker processes) on a few synthetic clients of
the model's input shape, with the run's algorithm and local plan and the threads
the candidate would run with. Candidates are only the configurations the run
may use and that compute the same updates (engine_choice.make_engine keeps every
refusal: a run that cannot use workers is never offered them).

A probe lasts seconds, so its figures are noisy: each candidate is timed
:data:`REPEATS` times, interleaved (A B A B), and keeps its best; and the
configuration the measured rules pick (the incumbent: engine_choice.auto_vectorize
and the worker layout) is replaced only by a candidate at least :data:`MARGIN`
times as fast. A short probe of the CNN once put one process of two threads
ahead of two one-thread workers that the full benchmark measures 1.4x faster;
the margin keeps such a flip from changing a run's engine, and with it its
float32 numbers.

The choice is cached beside the tensor cache (``engine-probe.json`` in
:func:`~fedforge.data.mnist.resolve_cache_dir`), keyed by torch's version, the
CPU (model name and flags), the model's name and parameter count and what was
measured (candidates, threads, plan); a changed key probes again. The
``FEDFORGE_PROBE`` environment variable sets the probe's length (samples per
candidate, default :data:`DEFAULT_SAMPLES`, each candidate stopped after
:data:`SECONDS`), or turns it off (``off`` or 0):
``engine: auto`` then takes the rule of engine_choice.auto_vectorize.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedforge.client.runtime import ClientRuntime, ClientTask, encode_payload
from fedforge.data.mnist import resolve_cache_dir
from fedforge.engines import Engine, close_engine
from fedforge.engines.threads import set_threads

PROBE_ENV = "FEDFORGE_PROBE"
DEFAULT_SAMPLES = 2400  # per timing at most: 4+ clients of up to 600 examples
SECONDS = 1.0  # per timing at most, after its warm-up (the clients done by then count)
REPEATS = 2  # timings per candidate, interleaved; the best counts
MARGIN = 1.25  # how much faster than the incumbent a candidate must be to replace it
PROBE_VERSION = 2  # in the cache key: a changed probe measures again
_WARM_ID = 1 << 30  # warm-up clients, from this id: one minibatch each
CACHE_NAME = "engine-probe.json"
MAX_ENTRIES = 64  # the cache keeps the newest entries
_PROBE_SEED = 0x9E3779B9


@dataclass(frozen=True)
class Candidate:
    """An engine configuration: ``inner`` ("serial" or "vectorized") in this
    process (``workers`` 0) or over ``workers`` processes; ``threads``: the torch
    threads of the process that trains (this one, or each worker)."""

    inner: str
    workers: int = 0
    threads: int = 1

    @property
    def name(self) -> str:
        return self.inner if self.workers == 0 else f"{self.inner}x{self.workers}"


@dataclass(frozen=True)
class ProbeInput:
    """What the probe needs of the run besides its runtime."""

    model: str
    sample: tuple[torch.Tensor, torch.Tensor]  # a client's (inputs, labels) of the run
    client_size: int  # the examples of a typical client (the median)


@dataclass(frozen=True)
class Choice:
    """The probe's pick and the samples/second of every candidate."""

    candidate: Candidate
    figures: dict[str, float]
    cached: bool

    def line(self) -> str:
        """The choice with its figures, in one line."""
        figs = ", ".join(f"{name} {rate:,.0f}" for name, rate in self.figures.items())
        where = "cached probe" if self.cached else "probe"
        kept = ""
        if self.figures and self.figures.get(self.candidate.name, 0.0) < max(self.figures.values()):
            kept = f"; the rules' pick, since none was {MARGIN:g}x as fast"
        return f"engine: auto runs {self.candidate.name} ({where}, samples/s: {figs}{kept})"


def probe_samples() -> int | None:
    """Samples per candidate from ``FEDFORGE_PROBE``; None: no probe."""
    text = os.environ.get(PROBE_ENV, "").strip().lower()
    if not text:
        return DEFAULT_SAMPLES
    if text in ("off", "0", "no", "false"):
        return None
    return int(text) if text.isdigit() else DEFAULT_SAMPLES


def cpu_id() -> str:
    """The CPU's model name and flags (what decides its kernels' speed)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "flags", "Features", "CPU part") and key not in found:
                    found[key] = value.strip()
    except OSError:
        pass
    text = " | ".join(f"{k}: {v}" for k, v in sorted(found.items()))
    return text or f"{platform.machine()} {platform.processor()}"


def cache_key(
    info: ProbeInput, num_params: int, candidates: Sequence[Candidate], detail: dict[str, Any]
) -> dict[str, Any]:
    """What the cached choice depends on."""
    return {
        "torch": torch.__version__,
        "cpu": hashlib.sha256(cpu_id().encode()).hexdigest()[:16],
        "model": info.model,
        "input_shape": list(info.sample[0].shape[1:]),
        "num_params": num_params,
        "candidates": [[c.inner, c.workers, c.threads] for c in candidates],
        **detail,
    }


def cache_path() -> Path:
    return resolve_cache_dir(None) / CACHE_NAME


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, entries: dict[str, Any]) -> None:
    """Best effort: a cache that cannot be written only means a probe next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        kept = dict(list(entries.items())[-MAX_ENTRIES:])
        tmp.write_text(json.dumps(kept, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def choose(
    candidates: Sequence[Candidate],
    incumbent: Candidate,
    runtime: ClientRuntime,
    info: ProbeInput,
    make: Callable[[Candidate, ClientRuntime], Engine],
    samples: int,
) -> Choice:
    """The fastest of ``candidates`` if it is :data:`MARGIN` times as fast as
    ``incumbent`` (one of them), else ``incumbent`` (the cached choice when the
    key matches); ``make`` builds a candidate's engine over a runtime."""
    plan = runtime.algorithm.plan(0)
    clients, size = _workload(candidates, info.client_size, samples)
    detail = {
        "batch_size": plan.batch_size,
        "local_epochs": plan.local_epochs,
        "dtype": str(runtime.dtype),
        "clients": clients,
        "client_size": size,
        "algorithm": runtime.algorithm.name,
        "incumbent": incumbent.name,
        "probe": PROBE_VERSION,
    }
    key = cache_key(info, runtime.spec.size, candidates, detail)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_path()
    entries = _read_cache(path)
    names = {c.name: c for c in candidates}
    hit = entries.get(digest)
    if isinstance(hit, dict) and hit.get("key") == key and hit.get("choice") in names:
        figures = {str(k): float(v) for k, v in hit.get("figures", {}).items()}
        return Choice(names[hit["choice"]], figures, cached=True)
    probe_rt = _synthetic_runtime(runtime, info, size)
    figures = dict.fromkeys((c.name for c in candidates), 0.0)
    for _ in range(REPEATS):
        for c in candidates:
            figures[c.name] = max(figures[c.name], _rate(c, probe_rt, make, clients, size))
    best = max(candidates, key=lambda c: figures[c.name])
    if figures[best.name] < MARGIN * figures[incumbent.name]:
        best = incumbent
    entries.pop(digest, None)
    entries[digest] = {"key": key, "choice": best.name, "figures": figures}
    _write_cache(path, entries)
    return Choice(best, figures, cached=False)


def _workload(candidates: Sequence[Candidate], client_size: int, samples: int) -> tuple[int, int]:
    """Clients and examples per client of the probe: at least two clients per
    worker (a pool's balance shows), ``samples`` in all."""
    most = max((c.workers for c in candidates), default=0)
    clients = max(4, 2 * most)
    size = max(1, min(client_size, samples // clients))
    return clients, size


def _synthetic_runtime(runtime: ClientRuntime, info: ProbeInput, size: int) -> ClientRuntime:
    """The run's model and algorithm over random clients of ``size`` examples:
    no stage, codec, gate or report touches the run's own state."""
    x, y = info.sample  # the run's own rows, repeated to the probe's client size
    reps = -(-size // max(len(y), 1))
    x, y = x.repeat(reps, *[1] * (x.dim() - 1))[:size], y.repeat(reps, *[1] * (y.dim() - 1))[:size]

    warm = runtime.algorithm.plan(0).batch_size or 1

    def data_fn(client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (x[:warm], y[:warm]) if client_id >= _WARM_ID else (x, y)

    model = copy.deepcopy(runtime.model)  # an engine may change its layout
    return ClientRuntime(model, runtime.spec, runtime.algorithm, data_fn)


def _rate(
    candidate: Candidate,
    runtime: ClientRuntime,
    make: Callable[[Candidate, ClientRuntime], Engine],
    clients: int,
    size: int,
) -> float:
    """Samples/second of one candidate over up to ``clients`` synthetic clients
    (those done within :data:`SECONDS`), after a warm-up of one minibatch a
    worker (which also starts a pool's processes)."""
    # one epoch a client, whatever the run's: the rate is per sample, and a run of
    # 1e9 local epochs must reach its own start lines (the workload warning)
    plan = dataclasses.replace(runtime.algorithm.plan(0), local_epochs=1)
    params = runtime.spec.flatten(runtime.model, runtime.dtype)
    payload = encode_payload(params, 0)
    tasks = [ClientTask(k, 0, plan, _PROBE_SEED) for k in range(clients)]
    warm = [ClientTask(_WARM_ID + k, 0, plan, _PROBE_SEED) for k in range(candidate.workers or 1)]
    before = set_threads(candidate.threads if candidate.workers == 0 else 1)
    engine = make(candidate, runtime)
    done = 0
    try:
        for _ in engine.run_cohort(warm, payload):
            pass
        t0 = time.perf_counter()
        uploads = engine.run_cohort(tasks, payload)
        for _ in uploads:
            done += 1
            if time.perf_counter() - t0 > SECONDS:
                break
        seconds = time.perf_counter() - t0
        close = getattr(uploads, "close", None)
        if close is not None:
            close()  # a pool's jobs still pending are dropped
    finally:
        close_engine(engine)
        set_threads(before)
    return done * size / max(seconds, 1e-9)

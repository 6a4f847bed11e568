"""Torch threads per process, engine: auto's probe and its cache, and the
initial model's evaluation only when asked."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData

from fedforge import config as config_mod
from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.core.errors import ConfigError
from fedforge.engines import SimulationEngine, close_engine
from fedforge.engines.pool import PoolEngine
from fedforge.engines.serial import SerialEngine
from fedforge.engines.threads import THREADS_ENV, thread_plan
from fedforge.server import engine_choice, loop, probe
from fedforge.server.experiment import build

pytestmark = pytest.mark.all_cores  # workers and probes read the usable cores

SIZES = [7, 12, 5, 9, 10, 6]


def _cfg(**kw: Any) -> config_mod.Config:
    base: dict[str, Any] = dict(
        model="2nn", num_clients=len(SIZES), client_fraction=0.5, batch_size=4, lr=0.05,
        rounds=1, target_accuracy=None, checkpoint_every=0, dtype="float32",
    )  # fmt: skip
    return config_mod.from_dict({**base, **kw})


@pytest.fixture(autouse=True)
def _no_env_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)


# --- threads ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "workers", "server", "worker"),
    [(8, 0, 8, 0), (2, 0, 2, 0), (1, 0, 1, 0), (2, 2, 2, 1), (8, 2, 8, 4), (6, 4, 6, 1),
     (3, 2, 3, 1), (16, 3, 16, 5)],
)  # fmt: skip
def test_default_threads_divide_the_cores(
    cores: int, workers: int, server: int, worker: int
) -> None:
    plan = thread_plan(None, cores, workers)
    assert (plan.server, plan.worker, plan.workers) == (server, worker, workers)
    assert workers * plan.worker <= max(cores, workers)  # the server waits while they train


def test_configured_threads_set_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (thread_plan(3, 8, 0).server, thread_plan(3, 8, 2).worker) == (3, 3)
    assert thread_plan(3, 8, 2).server == 3 and thread_plan(3, 8, 2).configured
    monkeypatch.setenv(THREADS_ENV, "2")
    assert thread_plan(None, 8, 0).server == 2  # the environment stands in for null
    assert thread_plan(5, 8, 0).server == 5  # the config wins


@pytest.mark.parametrize("bad", [0, -1, "two", 1.5, True])
def test_threads_field_is_checked(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"threads.*(integer >= 1|must be)"):
        _cfg(threads=bad)


def test_threads_field_accepts_null_and_counts() -> None:
    assert _cfg().threads is None and _cfg(threads=None).threads is None
    assert _cfg(threads=3).threads == 3
    assert config_mod.Config(threads=2).threads == 2
    with pytest.raises(
        ConfigError, match=r"'threads' = 0 is invalid: must be an integer in \[1, 1024\]"
    ):
        config_mod.Config(threads=0)


def test_build_divides_the_cores_between_server_and_workers(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 4)
    exp = build(_cfg(engine="serial", workers=2), make_data(SIZES, dtype=torch.float32))
    try:
        assert isinstance(exp.engine, PoolEngine) and exp.engine.threads == 2
        assert exp.threads is not None and (exp.threads.server, exp.threads.worker) == (4, 2)
    finally:
        close_engine(exp.engine)
    one = build(_cfg(engine="serial"), make_data(SIZES, dtype=torch.float32))
    assert one.threads is not None and one.threads.server == 4 and one.threads.workers == 0


class _Seen(SimulationEngine):
    """An engine wrapper noting torch's threads while the cohort trains."""

    def __init__(self, inner: Any, seen: list[int]) -> None:
        self.inner, self.seen, self.name = inner, seen, inner.name

    def run_cohort(self, tasks: Sequence[Any], payload: bytes) -> Iterator[Any]:
        self.seen.append(torch.get_num_threads())
        yield from self.inner.run_cohort(tasks, payload)

    def close(self) -> None:
        close_engine(self.inner)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_run_sets_the_configured_threads(
    threads: int, make_data: MakeData, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    seen: list[int] = []
    real_build = loop.build

    def seeing_build(c: Any, d: Any = None, t: Any = None) -> Any:
        exp = real_build(c, d, t)
        exp.engine = _Seen(exp.engine, seen)
        return exp

    monkeypatch.setattr(loop, "build", seeing_build)
    other, start = 3 - threads, torch.get_num_threads()
    torch.set_num_threads(other)
    try:
        loop.run(_cfg(threads=threads), make_data(SIZES, dtype=torch.float32), progress=True,
                 store=False)  # fmt: skip
        assert seen == [threads]
        assert torch.get_num_threads() == other  # the caller's threads are restored
    finally:
        torch.set_num_threads(start)
    out = capsys.readouterr().out
    assert f"torch threads: {threads} in this process (as configured)" in out


class _ThreadsInner(SerialEngine):
    """An inner engine whose uploads carry the worker's torch thread count."""

    def __init__(self) -> None:
        pass

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        for t in tasks:
            yield ClientUpload(t.client_id, str(torch.get_num_threads()).encode(), 0.0)


@pytest.mark.parametrize("threads", [1, 2])
def test_workers_set_their_threads(threads: int) -> None:
    pool = PoolEngine(_ThreadsInner(), 2, threads)
    try:
        tasks = [ClientTask(k, 0, None, 0) for k in range(4)]  # type: ignore[arg-type]
        assert {u.data for u in pool.run_cohort(tasks, b"")} == {str(threads).encode()}
    finally:
        pool.close()


# --- engine: auto's probe ----------------------------------------------------


@pytest.fixture
def probing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The probe on, tiny, with its cache in a temp folder; the candidates timed."""
    monkeypatch.setenv(probe.PROBE_ENV, "24")
    monkeypatch.setenv("FEDFORGE_CACHE", str(tmp_path / "cache"))
    timed: list[str] = []
    real = probe._rate

    def counting(candidate: probe.Candidate, *args: Any) -> float:
        """The real timing, then a steady figure: timings taken on this shared
        machine may disagree, and a busy probe's pick is not cached."""
        timed.append(candidate.name)
        assert real(candidate, *args) > 0
        return 100.0 * (1 + len(candidate.name))

    monkeypatch.setattr(probe, "_rate", counting)
    return timed


def test_the_probe_is_cached_and_reused(
    probing: list[str], make_data: MakeData, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 2)
    data = make_data(SIZES, dtype=torch.float32)
    first = build(_cfg(workers=0), data)
    close_engine(first.engine)
    names = ["serial", "serialx2", "vectorized", "vectorizedx2"]
    assert sorted(probing) == sorted(names * probe.REPEATS)  # each timed REPEATS times
    assert first.probe_line is not None and first.probe_line.startswith("engine: auto runs ")
    assert "(probe, samples/s: " in first.probe_line
    assert (tmp_path / "cache" / probe.CACHE_NAME).is_file()
    second = build(_cfg(workers=0), data)
    close_engine(second.engine)
    n = 4 * probe.REPEATS
    assert len(probing) == n  # no second probe
    assert second.engine.name == first.engine.name
    assert second.probe_line is not None and "cached probe" in second.probe_line
    # a new CPU, torch or model: probed again (timed by a stand-in, to be quick)
    monkeypatch.setattr(probe, "_rate", lambda c, *a: probing.append(c.name) or 1.0)
    monkeypatch.setattr(probe, "cpu_id", lambda: "another CPU")
    close_engine(build(_cfg(workers=0), data).engine)
    assert len(probing) == 2 * n
    monkeypatch.setattr(probe.torch, "__version__", "0.0.1")
    close_engine(build(_cfg(workers=0), data).engine)
    assert len(probing) == 3 * n
    close_engine(build(_cfg(workers=0, model="logreg"), data).engine)
    assert len(probing) == 4 * n


def test_the_probe_picks_the_fastest(
    probing: list[str], make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 2)
    rates = {"serial": 1.0, "serialx2": 3.0, "vectorized": 2.0, "vectorizedx2": 0.5}
    monkeypatch.setattr(probe, "_rate", lambda c, *a: rates[c.name])
    exp = build(_cfg(workers=0), make_data(SIZES, dtype=torch.float32))
    try:
        assert exp.engine.name == "serialx2" and isinstance(exp.engine, PoolEngine)
        assert exp.engine.threads == 1
    finally:
        close_engine(exp.engine)


def test_the_probe_keeps_the_rules_choice_unless_clearly_beaten(
    probing: list[str], make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rules' pick for the 2NN with workers: 0 (the vectorised engine in this
    process) stays against a candidate 1.2x as fast, not against one 1.3x."""
    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 2)
    data = make_data(SIZES, dtype=torch.float32)
    for challenger, picked in ((1.2, "vectorized"), (1.3, "serialx2")):
        rates = {"serial": 0.1, "serialx2": challenger, "vectorized": 1.0, "vectorizedx2": 0.5}
        monkeypatch.setattr(probe, "_rate", lambda c, *a, r=rates: r[c.name])
        monkeypatch.setattr(probe, "cpu_id", lambda ch=challenger: f"cpu {ch}")  # a new key
        exp = build(_cfg(workers=0), data)
        close_engine(exp.engine)
        assert exp.engine.name == picked, challenger


@pytest.mark.parametrize(
    "extra",
    [
        {"communication": {"uplink": "topk", "fraction": 0.1, "error_feedback": True}},
        {"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}},
    ],
)
def test_the_probe_keeps_the_refusals(
    extra: dict[str, Any], probing: list[str], make_data: MakeData,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A run that cannot use workers is never offered them, however fast."""
    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 2)
    monkeypatch.setattr(probe, "_rate", lambda c, *a: probing.append(c.name) or c.workers + 1.0)
    exp = build(_cfg(workers=0, **extra), make_data(SIZES, dtype=torch.float32))
    assert not isinstance(exp.engine, PoolEngine)
    assert probing and all("x" not in name for name in probing)


def test_explicit_engines_and_stateful_algorithms_never_probe(
    probing: list[str], make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 2)
    data = make_data(SIZES, dtype=torch.float32)
    for extra in ({"engine": "serial"}, {"engine": "vectorized"}, {"algorithm": "scaffold"}):
        exp = build(_cfg(workers=0, **extra), data)
        close_engine(exp.engine)
        assert exp.probe_line is None
    assert probing == []
    monkeypatch.setenv(probe.PROBE_ENV, "off")
    exp = build(_cfg(workers=0), data)
    assert exp.probe_line is None and probing == [] and exp.engine.name == "vectorized"


# --- the initial model's evaluation --------------------------------------------


@pytest.mark.parametrize("eval_initial", [False, True])
def test_the_initial_model_is_evaluated_only_when_asked(
    eval_initial: bool, make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    import fedforge.server.evaluate_round as round_mod

    real = round_mod.evaluate  # the round's and the baseline's test evaluation

    def counting(*args: Any, **kwargs: Any) -> Any:
        events.append("evaluate")
        return real(*args, **kwargs)

    monkeypatch.setattr(round_mod, "evaluate", counting)
    real_build = loop.build

    class Marking(_Seen):
        def run_cohort(self, tasks: Sequence[Any], payload: bytes) -> Iterator[Any]:
            events.append("round")
            yield from self.inner.run_cohort(tasks, payload)

    def marking_build(c: Any, d: Any = None, t: Any = None) -> Any:
        exp = real_build(c, d, t)
        exp.engine = Marking(exp.engine, [])
        return exp

    monkeypatch.setattr(loop, "build", marking_build)
    cfg = _cfg(evaluation={"initial": eval_initial}, rounds=2)
    result = loop.run(cfg, make_data(SIZES, dtype=torch.float32), store=False)
    if eval_initial:
        assert events == ["evaluate", "round", "evaluate", "round", "evaluate"]
        assert 0.0 <= result.summary["initial_accuracy"] <= 1.0
    else:
        assert events == ["round", "evaluate", "round", "evaluate"]
        assert "initial_accuracy" not in result.summary


@pytest.mark.parametrize("bad", ["abc", "-1", "0", "2000"])
def test_a_bad_threads_variable_is_named(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    """FEDFORGE_THREADS that is no count (or a count torch cannot start: a million
    crashed it) is a one-line error naming the variable, not silently ignored."""
    monkeypatch.setenv(THREADS_ENV, bad)
    with pytest.raises(ConfigError, match=r"FEDFORGE_THREADS=.* must be an integer in \[1, 1024\]"):
        thread_plan(None, 2, 0)
    with pytest.raises(ConfigError, match=r"'threads' = 1000000 is invalid: must be an integer"):
        _cfg(threads=1_000_000)


def test_the_probe_trains_one_epoch_whatever_the_run(
    probing: list[str], make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of the most local epochs allowed reaches its first lines: the
    probe's clients train one epoch each (its rate is per sample)."""
    import time

    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 2)
    t0 = time.perf_counter()
    exp = build(_cfg(workers=0, local_epochs=10_000), make_data(SIZES, dtype=torch.float32))
    close_engine(exp.engine)
    assert probing and time.perf_counter() - t0 < 60
    assert exp.probe_line is not None and "samples/s" in exp.probe_line

"""``engine: ray`` on a local Ray cluster of this machine (one per module): the
uploads equal the serial engine's in float64 (bit for bit when each upload
travels, to rounding when the workers sum them), the per-client state of
SCAFFOLD and error feedback lives on the workers and comes back from a
checkpoint into new workers, a client's error is one line, and what cannot
leave the driver is refused. The two-node cluster, a worker killed mid-round
and a killed driver are in tests/test_ray_cluster.py (slow)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import fedforge
from deploy_sim import free_port
from fedforge.config import parse
from fedforge.core import precision
from fedforge.core.errors import ConfigError, EngineError
from fedforge.core.precision import native_bf16
from fedforge.server import experiment
from fedforge.server.collectors import streaming
from fedforge.server.collectors.partial import UpdateSumming
from fedforge.server.hooks import RoundEnd, RoundHook, RoundInfo
from fedforge.store import RunStore

ray = pytest.importorskip("ray")


RUNS: list[Path] = []  # the module's folder of run stores (pytest's, pruned by it)


@pytest.fixture(scope="module", autouse=True)
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One local cluster for the module: each run's engine uses it (and leaves it up)."""
    RUNS[:] = [tmp_path_factory.mktemp("ray-runs")]
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def _cfg(engine: str, **kw: Any) -> Any:
    d: dict[str, Any] = {
        "dataset": "synthetic",
        "model": "logreg",
        "num_clients": 30,
        "client_fraction": 0.4,
        "rounds": 4,
        "lr": 0.02,  # a stable run: differences of rounding stay at rounding
        "dtype": "float64",
        "engine": engine,
        "threads": 1,
        "checkpoint_every": 1,
        "ray": {"workers": 2},
        "runs_dir": str(RUNS[0]),
    }
    d.update(kw)
    return parse.from_dict(d)


def count_shares(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The clients in each worker's sum the driver takes, one entry a share."""
    shares: list[int] = []
    take = streaming.StreamingMean.take_share

    def counted(self: streaming.StreamingMean, share: Any) -> list[int]:
        got = take(self, share)
        shares.append(len(got))
        return got

    monkeypatch.setattr(streaming.StreamingMean, "take_share", counted)
    return shares


def test_ray_equals_serial_per_upload_bitwise_and_summed_on_workers_to_1e9(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shares = count_shares(monkeypatch)
    serial = fedforge.run(_cfg("serial"))
    assert not shares
    each = fedforge.run(_cfg("ray", ray={"workers": 2, "aggregate_on_workers": False}))
    assert not shares and each.summary["engine"] == "rayx2"
    assert torch.equal(each.params, serial.params)
    summed = fedforge.run(_cfg("ray"))
    # every round summed on the workers (round 1, which judges its uploads by
    # their own median norm, in two passes): 2 shares a round, 12 clients
    assert len(shares) == 8 and sum(shares) == 4 * 12
    diff = float((summed.params - serial.params).abs().max())
    assert diff <= 1e-9
    for a, b in zip(summed.rounds, serial.rounds, strict=True):
        assert a.test_accuracy == pytest.approx(b.test_accuracy, abs=1e-9)
        assert a.float32_up == b.float32_up and a.cohort_size == b.cohort_size


def test_the_index_overlap_of_uploads_summed_on_workers_is_the_serial_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each worker counts its clients' index sets; the driver adds the counts."""
    shares = count_shares(monkeypatch)
    sparse = {"communication": {"uplink": "topk", "fraction": 0.1}, "rounds": 2}
    serial = fedforge.run(_cfg("serial", **sparse))
    summed = fedforge.run(_cfg("ray", **sparse))
    assert len(shares) >= 4  # every round summed on the workers
    rows = []
    for result in (serial, summed):
        with RunStore.open(result.run_dir, read_only=True) as store:
            rows.append(store.read_rows("index_overlap"))
    assert len(rows[0]) == 2 and rows[1] == rows[0]  # counts: the same sets, the same figures


@pytest.mark.slow
def test_a_summed_round_refuses_what_the_driver_would(tmp_path: Path) -> None:
    """A tight absolute norm bound refuses updates on the workers with the
    driver's own reason, and the round's bookkeeping matches the serial run's."""
    kw = {"robust": {"max_norm_multiple": None, "max_update_ratio": 0.02}}
    serial = fedforge.run(_cfg("serial", **kw))
    summed = fedforge.run(_cfg("ray", **kw))
    assert serial.rejected and not serial.skipped and not summed.skipped
    assert sorted(summed.rejected) == sorted(serial.rejected)  # logged in worker order
    # the same uploads counted (bytes can differ by a digit of a reported loss)
    assert [r.float32_up for r in summed.rounds] == [r.float32_up for r in serial.rounds]
    assert float((summed.params - serial.params).abs().max()) <= 1e-9


def test_a_first_round_judged_by_its_own_median_is_summed_in_two_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attackers' updates scaled 1,000x in the run's first round are refused by
    the cohort's own median norm on the workers, as the driver refuses them,
    and no upload reaches the driver: every round comes as one sum a worker."""
    kw = {"robust": {"attack": "scaled", "attack_fraction": 0.2, "attack_scale": 1000.0}}
    serial = fedforge.run(_cfg("serial", rounds=2, **kw))
    shares = count_shares(monkeypatch)
    summed = fedforge.run(_cfg("ray", rounds=2, **kw))
    assert len(shares) == 4
    first = [c for r, c, _ in serial.rejected if r == 0]
    assert first and sorted(c for r, c, _ in summed.rejected if r == 0) == sorted(first)
    assert sorted(summed.rejected) == sorted(serial.rejected)  # the same reasons
    assert all("this round's uploads" in why for r, _, why in summed.rejected if r == 0)
    assert float((summed.params - serial.params).abs().max()) <= 1e-9


def test_per_client_lrs_give_the_same_room_on_the_workers(tmp_path: Path) -> None:
    """Half the clients step at 4x the lr, half at 0.25x (a scale file). Held to
    2x the median norm like the others, some fast clients are refused (the
    serial run without ``local.lr_rule_scales_bounds``); with it, each is within
    its 4x room, and the workers judge each update with its client's room in
    both passes, as the driver does: none is refused, the model is the serial
    run's."""
    path = tmp_path / "scales.csv"
    path.write_text(
        "client_id,lr_scale\n" + "".join(f"{c},{4 if c < 15 else 0.25}\n" for c in range(30))
    )

    def cfg(engine: str, scaled: bool) -> Any:
        local = {"lr_rule": "lr_csv", "lr_rule_scales_bounds": scaled}
        options = {"lr_csv": {"path": str(path)}}
        robust = {"max_norm_multiple": 2.0}
        return _cfg(engine, rounds=3, robust=robust, local=local, plugin_options=options)

    held = fedforge.run(cfg("serial", False))
    assert held.rejected and all(c < 15 for _, c, _ in held.rejected)  # the premise
    serial = fedforge.run(cfg("serial", True))
    summed = fedforge.run(cfg("ray", True))
    assert serial.rejected == [] and summed.rejected == []
    assert float((summed.params - serial.params).abs().max()) <= 1e-9


class _KeptAtRoundEnd(RoundHook):
    """The round each worker still keeps uploads of, read at each round's end."""

    name = "kept"

    def __init__(self) -> None:
        self.kept: list[list[int | None]] = []

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        actors = info.exp.engine._actors  # type: ignore[attr-defined]
        self.kept.append(ray.get([a.kept_round.remote() for a in actors]))


def _kill_between_passes(
    monkeypatch: pytest.MonkeyPatch, when: str = "settle"
) -> tuple[list[list[list[float]]], list[UpdateSumming], list[Any], RoundHook]:
    """Worker 1's process SIGKILLed in the first round, once the first pass has
    reported (``when="settle"``: in the driver's first ``settle``) or once
    worker 0's sum is taken (``"take"``): each settle's reports and result, and
    the bound of each share the driver takes (recorded)."""
    settles: list[list[list[float]]] = []
    settled: list[UpdateSumming] = []
    taken: list[Any] = []
    engines: list[Any] = []
    settle, take = UpdateSumming.settle, streaming.StreamingMean.take_share

    def kill() -> None:
        pid = ray.get(engines[0]._actors[1].pid.remote())
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.01)

    def killing(self: UpdateSumming, reports: Any) -> UpdateSumming:
        settles.append([list(r) for r in reports])
        if len(settles) == 1 and when == "settle":
            kill()
        settled.append(settle(self, reports))
        return settled[-1]

    def taking(self: streaming.StreamingMean, share: Any) -> list[int]:
        taken.append(share.summing.limits.relative)
        if len(taken) == 1 and when == "take":
            kill()
        return take(self, share)

    class _Engine(RoundHook):
        name = "engine"

        def __init__(self) -> None:
            self.engines = engines

        def round_start(self, info: RoundInfo) -> None:
            engines.append(info.exp.engine)

    monkeypatch.setattr(UpdateSumming, "settle", killing)
    monkeypatch.setattr(streaming.StreamingMean, "take_share", taking)
    return settles, settled, taken, _Engine()


@pytest.mark.slow  # a worker killed mid-round: ~30 s (one such test stays in the default suite)
def test_a_worker_lost_between_the_two_passes_leaves_the_median_with_its_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``dropout``, worker 1 is lost between the passes: its clients are
    the round's dropouts, so the round is settled again from worker 0's norms
    alone (the median of the uploads it takes), worker 0's share is summed
    under that bound, and no worker keeps uploads past its round."""
    settles, settled, taken, engine = _kill_between_passes(monkeypatch)
    kept = _KeptAtRoundEnd()
    ends = _Ends()
    cfg = _cfg(
        "ray", rounds=2, client_fraction=0.5, ray={"workers": 2, "on_worker_failure": "dropout"}
    )
    fedforge.run(cfg, hooks=[engine, kept, ends])
    first, again = settles[0], settles[1]
    cohort = ends.rounds[0][0]
    # the reports come in worker order: worker 0's clients' norms, then worker 1's
    assert len(first) == 2 and again == first[:1] and len(settles) == 2
    assert len(first[0]) == sum(c % 2 == 0 for c in cohort)
    # the bound worker 0 summed under is the second settle's (and it differs)
    assert settled[0].limits.relative != settled[1].limits.relative
    assert taken[0] == settled[1].limits.relative
    assert ends.rounds[0][1] == [c for c in cohort if c % 2 == 0]
    assert ends.rounds[1][1] == ends.rounds[1][0]  # a new worker: round 2 is whole
    assert kept.kept == [[None, None], [None, None]]


def test_a_worker_lost_between_the_two_passes_is_retried_under_the_same_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``retry``, the new worker trains worker 1's clients again (the same
    uploads: a task's randomness is its seed's) and sums them under the one
    settled bound: the serial run to rounding."""
    serial = fedforge.run(_cfg("serial", rounds=2))
    settles, settled, taken, engine = _kill_between_passes(monkeypatch)
    ends = _Ends()
    result = fedforge.run(_cfg("ray", rounds=2), hooks=[engine, ends])
    assert len(settles) == 1 and taken[:2] == [settled[0].limits.relative] * 2
    assert all(used == cohort for cohort, used in ends.rounds)
    assert float((result.params - serial.params).abs().max()) <= 1e-9


@pytest.mark.slow  # a worker killed mid-round: ~30 s (one such test stays in the default suite)
def test_a_worker_lost_once_the_round_is_settled_is_replaced_even_under_dropout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Worker 1 is lost after both workers summed under the settled bound, once
    worker 0's sum is taken: its norms are in the bound, so under ``dropout``
    too a new worker trains its clients again and sums them under that bound
    (the sums are asked for one at a time: worker 1's after worker 0's is
    taken). The whole cohort is used, as in the serial run (to rounding)."""
    serial = fedforge.run(_cfg("serial", rounds=2))
    settles, settled, taken, engine = _kill_between_passes(monkeypatch, when="take")
    ends = _Ends()
    cfg = _cfg("ray", rounds=2, ray={"workers": 2, "on_worker_failure": "dropout"})
    result = fedforge.run(cfg, hooks=[engine, ends])
    assert engine.engines[0].restarts == 1  # type: ignore[attr-defined]
    assert len(settles) == 1 and taken[:2] == [settled[0].limits.relative] * 2
    assert all(used == cohort for cohort, used in ends.rounds)
    assert float((result.params - serial.params).abs().max()) <= 1e-9


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class _Ends(RoundHook):
    """Each round's cohort and the clients whose updates the model took."""

    name = "ends"

    def __init__(self) -> None:
        self.rounds: list[tuple[list[int], list[int]]] = []

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        self.rounds.append((sorted(info.cohort), sorted(end.used)))


class _CrashAfter(RoundHook):
    """Ends the run (as a crash would) once round ``n`` is recorded."""

    name = "crash"

    def __init__(self, n: int) -> None:
        self.n = n

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        if info.round_idx == self.n:
            raise RuntimeError("crash")


@pytest.mark.parametrize(
    "extra",
    [
        {"algorithm": "scaffold"},
        pytest.param(
            {"communication": {"uplink": "topk", "error_feedback": True}}, marks=pytest.mark.slow
        ),
    ],
    ids=["scaffold", "error_feedback"],
)
def test_per_client_state_lives_on_the_workers_and_resumes_into_new_ones(
    extra: dict[str, Any], tmp_path: Path
) -> None:
    serial = fedforge.run(_cfg("serial", **extra))
    cfg = _cfg("ray", runs_dir=str(tmp_path), **extra)  # its run alone in the folder
    with pytest.raises(RuntimeError, match="crash"):
        fedforge.run(cfg, hooks=[_CrashAfter(2)])  # rounds 1-2 checkpointed
    run_dir = max(Path(cfg.runs_dir).iterdir())
    resumed = fedforge.resume(run_dir)
    assert resumed.summary["engine"] == "rayx2"
    assert torch.equal(resumed.params, serial.params)


def test_a_client_error_is_one_line_naming_client_and_round(tmp_path: Path) -> None:
    plugin = tmp_path / "failing_stage.py"
    plugin.write_text(
        "import fedforge\n"
        "class Fails:\n"
        "    name = 'fails_on_seven'\n"
        "    where = 'client'\n"
        "    linear = False\n"
        "    constraints = ()\n"
        "    def apply(self, delta, ctx):\n"
        "        if ctx.client_id == 7:\n"
        "            raise ValueError('client seven cannot')\n"
        "        return delta\n"
        "fedforge.register_stage('fails_on_seven', lambda ctx: Fails())\n"
    )
    cfg = _cfg(
        "ray",
        num_clients=8,
        client_fraction=1.0,
        plugins=[str(plugin)],
        pipeline={"client": ["fails_on_seven"]},
    )
    with pytest.raises(EngineError) as err:
        fedforge.run(cfg)
    line = str(err.value)
    assert "client 7 failed in round 1" in line and "client seven cannot" in line
    assert "\n" not in line


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}}, "secure aggregation"),
        (
            {"privacy": {"dp": "central", "noise_multiplier": 1.0, "adaptive_clip": True}},
            "adaptive clipping",
        ),
    ],
)
def test_what_cannot_leave_the_driver_is_refused_in_one_line(
    extra: dict[str, Any], why: str
) -> None:
    with pytest.raises(ConfigError, match=f"engine: ray cannot run this: {why}"):
        fedforge.build(_cfg("ray", **extra))


def test_without_ray_the_run_says_which_extra_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(EngineError, match=r"pip install 'fedforge\[ray\]'"):
        fedforge.build(_cfg("ray"))


@pytest.mark.parametrize(
    ("extra", "error", "why"),
    [
        ({"workers": 8}, EngineError, r"ray.workers 8 x ray.num_cpus 1 asks for 8 CPUs; .* has 2"),
        ({"workers": 2, "num_gpus": 0.5}, ConfigError, r"ray.num_gpus 0.5 .* device is 'cpu'"),
    ],
    ids=["cpus", "gpus_on_cpu_device"],
)
def test_what_the_cluster_cannot_give_is_refused_before_any_worker_waits(
    extra: dict[str, Any], error: type[Exception], why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[Any] = []
    run_data = experiment._run_data
    monkeypatch.setattr(experiment, "_run_data", lambda *a: loads.append(1) or run_data(*a))
    with pytest.raises(error, match=why):
        fedforge.build(_cfg("ray", ray=extra))
    # GPUs reserved for a CPU run are refused before the data loads
    assert loads == ([] if "num_gpus" in extra else [1])


@pytest.mark.slow  # its own Ray cluster: ~30 s
def test_bf16_is_judged_on_the_workers_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The note on emulated bf16 is the workers' (they train), and says on how
    many: the driver's CPU, made to read as one without bf16, is not asked; it
    is where the driver trains (the proxy's tuning steps)."""
    workers_native = native_bf16()  # the workers run on this machine's CPUs
    monkeypatch.setattr(precision, "native_bf16", lambda: False)

    def note(**kw: Any) -> str:
        exp = fedforge.build(_cfg("ray", precision="bf16", dtype="float32", **kw))
        exp.engine.close()
        return exp.note or ""

    said = note()
    if workers_native:
        assert "bf16 is emulated" not in said
    else:
        assert "bf16 is emulated" in said and "(2 of 2 Ray workers)" in said
    assert "bf16 is emulated" in note(proxy={"size": 60, "tune_epochs": 1})


def test_gpu_workers_on_a_cluster_without_gpus_is_one_line() -> None:
    """device: cuda with GPUs reserved for the workers: the driver (no GPU here)
    is not refused for its own device; the cluster's missing GPUs are."""
    cfg = _cfg("ray", device="cuda", ray={"workers": 2, "num_gpus": 0.5})
    with pytest.raises(EngineError, match=r"asks for 1 GPUs; the Ray cluster has 0"):
        fedforge.build(cfg)


def test_an_address_where_no_cluster_answers_is_refused_at_once() -> None:
    from fedforge.engines.ray_connect import connect, host_port

    assert host_port("ray://10.0.0.1:10001") == ("10.0.0.1", 10001)
    assert host_port("[::1]:6379") == ("::1", 6379)
    assert host_port("auto") is None
    port = free_port()  # a port of this machine that nothing listens on
    with pytest.raises(
        EngineError, match=rf"no Ray cluster answers at ray.address '127.0.0.1:{port}'"
    ):
        connect(ray, f"127.0.0.1:{port}")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_workers_train_on_the_gpu_they_reserve() -> None:
    """With a GPU: two workers share it (``num_gpus: 0.5``) and train there, in
    float64, to the serial CPU run's model within 1e-9."""
    serial = fedforge.run(_cfg("serial"))
    cfg = _cfg("ray", device="cuda", ray={"workers": 2, "num_gpus": 0.5})
    exp = fedforge.build(cfg)
    try:
        actors = exp.engine._actors  # type: ignore[attr-defined]
        devices = ray.get([a.device.remote() for a in actors])
    finally:
        exp.engine.close()
    assert devices == ["cuda:0", "cuda:0"]
    on_gpu = fedforge.run(cfg)
    assert float((on_gpu.params - serial.params).abs().max()) <= 1e-9

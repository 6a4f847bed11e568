"""``device: cpu | cuda | cuda:N | auto``: the config field, its resolution where
the run is built, the CPU paths it leaves as they were, and (marked ``cuda``,
skipped without a GPU) a float64 run on CUDA against the same run on the CPU."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData, RunStopped

import fedforge as ff
from fedforge.algorithms import fedavg
from fedforge.algorithms.base import cross_entropy
from fedforge.algorithms.plan import LocalPlan
from fedforge.cli import main
from fedforge.client import cnn_step
from fedforge.config import Config, override
from fedforge.core.device import HOST, module_device, resolve_device
from fedforge.core.errors import ConfigError
from fedforge.engines import batched_mlp
from fedforge.engines.pool import PoolEngine
from fedforge.engines.serial import SerialEngine
from fedforge.models.mnist import MnistCNN, MnistMLP
from fedforge.server import engine_choice
from fedforge.server.engine_choice import choose_engine
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run
from fedforge.store import RunStore

CUDA = torch.cuda.is_available()
ALLOWED = "'cpu', 'cuda', 'cuda:N' (N an integer >= 0) or 'auto'"

# A tiny float64 run: 4 clients, every one each round, 3 rounds.
TINY: dict[str, Any] = {
    "model": "2nn",
    "num_clients": 4,
    "client_fraction": 1.0,
    "batch_size": 5,
    "lr": 0.05,
    "rounds": 3,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
    "threads": 1,
}
SIZES = [12, 9, 15, 10]


def _cfg(tmp_path: Path, **fields: Any) -> Config:
    return override(Config(), {**TINY, "runs_dir": str(tmp_path), **fields})


# ----------------------------------------------------------------------------- the field


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0", "cuda:7", "cuda:12", "auto"])
def test_the_config_takes_every_device_name(name: str) -> None:
    assert Config(device=name).device == name  # whether it exists here: at build


def test_the_default_device_is_the_cpu() -> None:
    assert Config().device == "cpu"


@pytest.mark.parametrize(
    "value", ["gpu", "CPU", "cuda:", "cuda:-1", "cuda:x", "cuda:1.5", "cuda0", "mps", "", " cpu"]
)
def test_other_device_names_are_refused_in_one_line_naming_the_value(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        Config(device=value)
    text = str(err.value)
    assert text == f"config field 'device' = {value!r} is invalid: must be {ALLOWED}"
    assert "\n" not in text


def test_a_device_from_yaml_or_set_is_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("device: 0\n")  # YAML reads a number: the name '0'
    with pytest.raises(ConfigError, match=r"'device' = '0' is invalid: must be 'cpu'"):
        ff.load(path)
    with pytest.raises(ConfigError, match=r"'device' = 'tpu' is invalid"):
        override(Config(), {"device": "tpu"})


# ----------------------------------------------------------------------------- resolution


@pytest.mark.skipif(CUDA, reason="torch sees a GPU here: auto is cuda")
def test_auto_resolves_to_the_cpu_without_cuda(tmp_path: Path, make_data: MakeData) -> None:
    assert resolve_device("auto") == HOST
    exp = build(_cfg(tmp_path, device="auto"), make_data(SIZES))
    assert exp.device == HOST
    assert module_device(exp.model) == HOST


@pytest.mark.skipif(CUDA, reason="torch sees a GPU here")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_is_refused_without_it_in_one_line(tmp_path: Path, name: str) -> None:
    # refused before any data is read: this data folder does not exist
    cfg = _cfg(tmp_path, device=name, data_dir=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError) as err:
        build(cfg)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"config field 'device' = {name!r} is invalid: torch ")
    assert torch.__version__ in text
    if torch.version.cuda is None:
        assert "is a CPU build" in text
    assert "device: cpu" in text and "device: auto" in text


def test_a_cuda_index_past_the_devices_torch_sees_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a machine with one GPU, as torch would report it (no CUDA call is made)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(ConfigError) as err:
        resolve_device("cuda:3")
    assert str(err.value) == (
        "config field 'device' = 'cuda:3' is invalid: torch sees 1 CUDA device (cuda:0); "
        "name one of them, or set device: cpu, or device: auto (cuda when torch sees a "
        "GPU, else cpu)"
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"sees 2 CUDA devices \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:2")


# ----------------------------------------------------------------------------- the CPU


@pytest.mark.parametrize(("model", "engine"), [("cnn", "serial"), ("2nn", "vectorized")])
def test_a_cpu_run_is_the_default_run_bit_for_bit(
    tmp_path: Path, make_data: MakeData, model: str, engine: str
) -> None:
    # McMahan's CNN on the serial engine takes the written-out step, the 2NN on the
    # vectorised one the batched products: the CPU's fused paths, device or not
    data = make_data(SIZES)
    fields = {"model": model, "engine": engine, "rounds": 2, "evaluation": {"clients": True}}
    default = run(_cfg(tmp_path / "default", **fields), data)
    names = ["cpu"] + ([] if CUDA else ["auto"])
    for name in names:
        other = run(_cfg(tmp_path / name, device=name, **fields), data)
        assert torch.equal(other.params, default.params)
        figures = [
            [(r.train_loss, r.test_accuracy, r.test_loss) for r in x.rounds]
            for x in (other, default)
        ]
        assert figures[0] == figures[1]
        assert other.run_dir is not None and default.run_dir is not None
        with RunStore.open(other.run_dir) as a, RunStore.open(default.run_dir) as b:
            rows_a = [(c.client_id, c.train_loss, c.update_norm) for c in a.client_rounds()]
            rows_b = [(c.client_id, c.train_loss, c.update_norm) for c in b.client_rounds()]
        assert rows_a == rows_b


def test_the_fused_cpu_kernels_are_not_taken_off_the_cpu() -> None:
    # the meta device stands in for a GPU: the kernels check where the model is
    sgd = LocalPlan(1, 10, 0.1)
    cnn = MnistCNN()
    assert cnn_step.applies(cnn, sgd, cross_entropy, None, None, torch.float32)
    assert not cnn_step.applies(cnn.to("meta"), sgd, cross_entropy, None, None, torch.float32)
    mlp, alg = MnistMLP(), fedavg(sgd)
    assert batched_mlp.applies(mlp, alg, sgd, None)
    assert not batched_mlp.applies(mlp.to("meta"), alg, sgd, None)


def test_worker_processes_are_not_used_off_the_cpu(
    tmp_path: Path, make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_choice, "usable_cores", lambda: 4)
    exp = build(_cfg(tmp_path, engine="serial"), make_data(SIZES))
    runtime = exp.engine.runtime  # type: ignore[attr-defined]
    on_cpu = choose_engine("serial", runtime, workers=2)
    assert isinstance(on_cpu.engine, PoolEngine)
    on_cpu.engine.close()
    runtime.model = copy.deepcopy(runtime.model).to("meta")  # a model off the host
    choice = choose_engine("serial", runtime, workers=2)
    assert isinstance(choice.engine, SerialEngine)
    assert choice.notes == [
        "workers: 2 cannot be used on meta (worker processes are forked and CUDA does not "
        "survive a fork; one process drives the GPU)"
    ]


def test_a_run_resumes_on_another_device(
    tmp_path: Path,
    make_data: MakeData,
    run_stopped: RunStopped,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = make_data(SIZES)
    cfg = _cfg(tmp_path, rounds=4, checkpoint_every=1)
    whole = run(_cfg(tmp_path / "whole", rounds=4, checkpoint_every=1), data)
    stopped = run_stopped(cfg, data, 1)
    assert stopped.run_dir is not None and stopped.stopped == "SIGTERM"
    if not CUDA:  # the stored device may be one this machine lacks: refused in one line
        with pytest.raises(ConfigError, match=r"'device' = 'cuda' is invalid: torch"):
            resume(stopped.run_dir, data, device="cuda")
    with pytest.raises(ConfigError, match=r"'device' = 'gpu' is invalid"):
        resume(stopped.run_dir, data, device="gpu")
    capsys.readouterr()  # the runs' own lines
    assert main(["resume", str(stopped.run_dir), "--device", "gpu", "-q"]) == 2
    err = capsys.readouterr().err
    assert err == f"fedforge: error: config field 'device' = 'gpu' is invalid: must be {ALLOWED}\n"
    done = resume(stopped.run_dir, data, device="auto" if not CUDA else "cpu")
    assert torch.equal(done.params, whole.params)


# ----------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (torch.cuda.is_available())")
@pytest.mark.parametrize(
    ("model", "engine", "extra"),
    [
        ("2nn", "serial", {}),
        ("2nn", "vectorized", {}),
        ("2nn", "vectorized", {"algorithm": "scaffold"}),
        ("2nn", "serial", {"local.momentum": 0.9, "evaluation.clients": True}),
        ("cnn", "serial", {}),
    ],
)
def test_a_float64_run_on_cuda_equals_the_cpu_run(
    tmp_path: Path, make_data: MakeData, model: str, engine: str, extra: dict[str, Any]
) -> None:
    data = make_data(SIZES)
    fields = {"model": model, "engine": engine, **extra}
    on_cpu = run(_cfg(tmp_path / "cpu", device="cpu", **fields), data)
    on_gpu = run(_cfg(tmp_path / "cuda", device="cuda", **fields), data)
    assert on_gpu.params.device == HOST  # the global vector stays on the host
    torch.testing.assert_close(on_gpu.params, on_cpu.params, rtol=0, atol=1e-9)
    for a, b in zip(on_gpu.rounds, on_cpu.rounds, strict=True):
        assert isinstance(a.test_loss, float) and isinstance(a.test_accuracy, float)
        assert a.test_loss == pytest.approx(b.test_loss, abs=1e-9)
        assert a.train_loss == pytest.approx(b.train_loss, abs=1e-9)


@pytest.mark.cuda
@pytest.mark.all_cores  # asks for 2 workers: a worker's one core would lower them first
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (torch.cuda.is_available())")
def test_a_cuda_build_puts_the_model_there_and_the_global_vector_on_the_host(
    tmp_path: Path, make_data: MakeData
) -> None:
    exp = build(_cfg(tmp_path, device="cuda", workers=2), make_data(SIZES))
    assert exp.device.type == "cuda" and module_device(exp.model) == exp.device
    assert exp.initial_params.device == HOST
    assert exp.note is not None and "cannot be used on cuda" in exp.note

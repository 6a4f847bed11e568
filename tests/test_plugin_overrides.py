"""A config file and its ``--set`` overrides are one config: the component names
are checked once, after the overrides, so an override may replace a plugin's
name with a built-in, or the config's ``plugins`` with files that are there."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedforge
from fedforge.cli import main
from fedforge.config import from_dict, load
from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.store import RunStore
from fedforge.store.final import load_final

EXAMPLES = Path(__file__).parent.parent / "examples"

CONFIG = """\
dataset: synthetic
model: logreg
num_clients: 4
client_fraction: 1.0
rounds: 1
local_epochs: 1
batch_size: 10
dtype: float64
engine: serial
target_accuracy: null
"""


def _only_run(runs: Path) -> Path:
    [run_dir] = list(runs.iterdir())
    return run_dir


def test_an_override_replaces_a_plugin_algorithm_nobody_loaded(tmp_path: Path) -> None:
    """``fedforge run --config examples/fednova.yaml -s algorithm=fedavg`` without
    the plugin: the file alone names an algorithm nobody registered; with the
    override it is a FedAvg run, the same as one written as FedAvg."""
    assert not registry.is_registered("algorithm", "nobody_loaded_this")
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG + "algorithm: nobody_loaded_this\n")
    runs = tmp_path / "runs"
    argv = ["run", "-c", str(config), "--runs-dir", str(runs), "-q"]
    assert main([*argv, "-s", "algorithm=fedavg"]) == 0
    with RunStore.open(_only_run(runs), read_only=True) as store:
        assert store.config().algorithm == "fedavg"
    plain = from_dict({**_yaml(CONFIG), "algorithm": "fedavg", "runs_dir": str(tmp_path / "b")})
    expected = fedforge.run(plain, progress=False).params
    assert torch.equal(load_final(_only_run(runs))["params"], expected)


def test_an_override_replaces_the_configs_plugins(tmp_path: Path) -> None:
    """The file lists a plugin file that is not there; ``-s plugins=[...]`` gives
    the one that is, whose algorithm the file names (without ``--plugin``)."""
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG + "plugins: [gone.py]\nalgorithm: fednova\n")
    with pytest.raises(ConfigError, match="gone.py"):
        load(config)
    cfg = load(config, {"plugins": [str(EXAMPLES / "fednova.py")]})
    assert (cfg.algorithm, cfg.plugins) == ("fednova", (str(EXAMPLES / "fednova.py"),))
    assert fedforge.algorithms.from_config(cfg).name == "fednova"
    dropped = load(config, {"plugins": [], "algorithm": "fedprox"})  # a built-in instead
    assert (dropped.algorithm, dropped.plugins) == ("fedprox", ())


def test_an_override_replaces_a_plugins_name_given_with_plugin(tmp_path: Path) -> None:
    """With ``--plugin`` and the config's own plugin missing: the override drops
    both the file and the name; the run is FedAvg."""
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG + "plugins: [gone.py]\nalgorithm: nobody_loaded_this\n")
    runs = tmp_path / "runs"
    argv = ["run", "--plugin", str(EXAMPLES / "fednova.py"), "-c", str(config)]
    sets = ["-s", "plugins=[]", "-s", "algorithm=fedavg"]
    assert main([*argv, *sets, "--runs-dir", str(runs), "-q"]) == 0
    with RunStore.open(_only_run(runs), read_only=True) as store:
        assert (store.config().algorithm, store.config().plugins) == ("fedavg", ())


def test_the_names_after_the_overrides_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check still runs, on the config the overrides made: a name an override
    gives that nobody registered is one line naming it."""
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG + "algorithm: fedavg\n")
    argv = ["run", "-c", str(config), "-s", "algorithm=nor_this", "-q"]
    assert main([*argv, "--runs-dir", str(tmp_path / "runs")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("fedforge: error: config field 'algorithm' = 'nor_this' is invalid")
    assert not (tmp_path / "runs").exists()


def test_an_override_starts_a_section_the_file_leaves_out(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG + "algorithm: fedavg\n")
    cfg = load(config, {"partition.kind": "iid", "server_optimizer.kind": "adam"})
    assert (cfg.partition.kind, cfg.server_optimizer.kind) == ("iid", "adam")
    with pytest.raises(ConfigError, match="unknown config section 'rounds'"):
        load(config, {"rounds.x": 1})


def _yaml(text: str) -> dict[str, object]:
    import yaml

    data: dict[str, object] = yaml.safe_load(text)
    return data

"""Plugins found by the commands: a .py file given to ``fedforge run --plugin``,
the config's ``plugins`` field, and an installed distribution's
``fedforge.plugins`` entry point, discovered without an import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fedforge
from fedforge.config import from_dict
from fedforge.core import registry
from fedforge.store.final import load_final

# a FedProx copy, in a file of its own, through the public API only
PLUGIN = """\
from dataclasses import dataclass

import fedforge
from fedforge.algorithms import drops_stragglers, local_plan
from fedforge.algorithms.plan import DecayedPlan, cross_entropy


@dataclass(frozen=True)
class Options:
    mu: float = 0.01


class Proximal:
    def __init__(self, mu):
        self.mu = mu

    def __call__(self, grads, ctx):
        for grad, w, anchor in zip(grads, ctx.params, ctx.anchor):
            grad.add_(w - anchor, alpha=self.mu)


def factory(context):
    cfg = context.cfg
    return fedforge.Algorithm(
        "NAME",
        DecayedPlan(local_plan(cfg), cfg.lr_decay),
        cross_entropy,
        grad_hook=Proximal(context.options.mu),
        drop_stragglers=drops_stragglers(cfg, False),
    )


fedforge.register_algorithm("NAME", factory, options=Options)
"""

CONFIG = """\
dataset: synthetic
model: logreg
num_clients: 4
client_fraction: 1.0
rounds: 2
local_epochs: 1
batch_size: 10
dtype: float64
engine: serial
"""


def _env(*paths: Path) -> dict[str, str]:
    """This process's environment (its PYTHONPATH: the fedforge under test) and ``paths``."""
    given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*given, *map(str, paths)])}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fedforge.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env or _env(),
    )


def test_fedforge_run_takes_a_plugin_file(tmp_path: Path) -> None:
    plugin = tmp_path / "cli_prox.py"
    plugin.write_text(PLUGIN.replace("NAME", "cli_prox"))
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG + "algorithm: cli_prox\nplugin_options: {cli_prox: {mu: 0.2}}\n")
    runs = tmp_path / "runs"
    done = _cli("run", "--plugin", str(plugin), "-c", str(config), "--runs-dir", str(runs), "-q")
    assert done.returncode == 0, done.stderr
    [run_dir] = list(runs.iterdir())
    builtin = from_dict(
        {
            **_yaml(CONFIG),
            "algorithm": "fedprox",
            "fedprox": {"mu": 0.2},
            "runs_dir": str(tmp_path / "b"),
        }
    )
    expected = fedforge.run(builtin, progress=False).params
    assert torch.equal(load_final(run_dir)["params"], expected)

    refused = _cli("run", "-c", str(config), "--runs-dir", str(runs), "-q")  # no --plugin
    [line] = refused.stderr.strip().splitlines()
    assert refused.returncode == 2
    assert line.startswith("fedforge: error: config field 'algorithm' = 'cli_prox' is invalid")


def test_the_config_names_its_plugins(tmp_path: Path) -> None:
    plugin = tmp_path / "field_prox.py"
    plugin.write_text(PLUGIN.replace("NAME", "field_prox"))
    try:
        cfg = from_dict({**_yaml(CONFIG), "plugins": [str(plugin)], "algorithm": "field_prox"})
        assert fedforge.algorithms.from_config(cfg).name == "field_prox"
    finally:
        registry.unregister("algorithm", "field_prox")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("/no/such/plugin.py", "plugin '/no/such/plugin.py': no such file"),
        ("no_such_plugin_module", "plugin 'no_such_plugin_module': no module named"),
    ],
)
def test_a_missing_plugin_is_refused_in_one_line(spec: str, message: str) -> None:
    done = _cli("run", "--plugin", spec)
    [line] = done.stderr.strip().splitlines()
    assert done.returncode == 2 and line.startswith(f"fedforge: error: {message}")


def test_a_plugin_that_fails_to_import_is_named(tmp_path: Path) -> None:
    plugin = tmp_path / "broken.py"
    plugin.write_text("raise RuntimeError('half written')\n")
    with pytest.raises(fedforge.ConfigError, match=r"broken\.py' failed to import: Runtime"):
        fedforge.load_plugin(str(plugin))


def test_an_installed_entry_point_is_found_without_an_import(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "ep_plug-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-plug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[fedforge.plugins]\nby_call = ep_plug_call:register_all\nby_module = ep_plug_module\n"
    )
    (site / "ep_plug_call.py").write_text(
        "import fedforge\n\n\ndef register_all():\n"
        "    fedforge.register_algorithm('ep_prox', lambda c: None)\n"
    )
    (site / "ep_plug_module.py").write_text(
        "import fedforge\nfedforge.register_aggregator('ep_mean', lambda c: None)\n"
    )
    code = textwrap.dedent(
        """\
        import sys
        from fedforge.config import from_dict
        assert not any(m.startswith('ep_plug') for m in sys.modules)
        cfg = from_dict({'algorithm': 'ep_prox', 'robust': {'aggregator': 'ep_mean'}})
        print(cfg.algorithm, cfg.robust.aggregator)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(site), timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ep_prox", "ep_mean"]


def test_a_broken_entry_point_is_said_at_every_question(tmp_path: Path) -> None:
    """Of two installed entry points the first raises: every question to the
    registry in that process is refused with its one line (not the first alone,
    after which the other plugin would silently be missing)."""
    site = tmp_path / "site"
    info = site / "ep_two-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-two\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[fedforge.plugins]\na_broken = ep_broken\nb_good = ep_good\n"
    )
    (site / "ep_broken.py").write_text("raise RuntimeError('boom')\n")
    (site / "ep_good.py").write_text(
        "import fedforge\nfedforge.register_aggregator('good_mean', lambda c: None)\n"
    )
    code = textwrap.dedent(
        """\
        from fedforge.core import registry
        from fedforge.core.errors import ConfigError
        for _ in range(2):
            try:
                registry.is_registered('aggregator', 'good_mean')
            except ConfigError as exc:
                print(str(exc).splitlines()[0])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(site), timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    said = "plugin entry point 'a_broken' (ep_broken) failed to load: RuntimeError: boom"
    assert lines == [said, said], lines


def _yaml(text: str) -> dict[str, object]:
    import yaml

    data: dict[str, object] = yaml.safe_load(text)
    return data


def test_a_config_files_plugin_paths_are_read_from_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "experiment"
    folder.mkdir()
    (folder / "beside_prox.py").write_text(PLUGIN.replace("NAME", "beside_prox"))
    config = folder / "run.yaml"
    config.write_text(CONFIG + "algorithm: beside_prox\nplugins: [beside_prox.py]\n")
    try:
        cfg = fedforge.load(config)  # from another working directory than the file's
        assert cfg.plugins == (str(folder / "beside_prox.py"),)
        assert cfg.algorithm == "beside_prox"
    finally:
        registry.unregister("algorithm", "beside_prox")


@pytest.mark.slow  # the default suite: its twin in test_plugin_contracts / test_deployment_plugins
def test_a_deployment_runs_a_plugin_given_to_server_and_clients(tmp_path: Path) -> None:
    from deploy_procs import run_dir_of, start_client, start_server, write_config

    plugin = tmp_path / "net_prox.py"
    plugin.write_text(PLUGIN.replace("NAME", "net_prox"))
    cfg = write_config(
        tmp_path / "cfg.yaml",
        algorithm="net_prox",
        plugin_options={"net_prox": {"mu": 0.2}},
        rounds=2,
    )
    with pytest.raises(AssertionError, match="config field 'algorithm' = 'net_prox' is invalid"):
        start_server(tmp_path, cfg, "--insecure")  # no --plugin: refused at start
    server, port = start_server(tmp_path, cfg, "--insecure", "--plugin", str(plugin))
    clients = [
        start_client(tmp_path, port, ids, "--insecure", "--plugin", str(plugin))
        for ids in ("0-2", "3-5")
    ]
    assert server.wait(180) == 0, server.log.read_text()
    for client in clients:
        assert client.wait(60) == 0, client.log.read_text()
    deployed = load_final(tmp_path / run_dir_of(server))["params"]
    data = {
        **_yaml(cfg.read_text()),
        "algorithm": "fedprox",
        "fedprox": {"mu": 0.2},
        "plugin_options": {},
    }
    builtin = from_dict({**data, "runs_dir": str(tmp_path / "sim")})
    simulated = fedforge.run(builtin, progress=False).params
    assert (deployed - simulated).abs().max().item() <= 1e-9

"""The registry: components by kind and name, the built-ins among them; a plugin
algorithm, aggregator and server optimizer defined here, run by name from a
config, against the built-ins they copy (float64, serial engine: bit-identical)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import fedforge
from fedforge.algorithms import Algorithm, drops_stragglers, local_plan
from fedforge.algorithms.local import StepContext
from fedforge.algorithms.plan import DecayedPlan, cross_entropy
from fedforge.config import from_dict
from fedforge.config.components import ComponentContext, check_names
from fedforge.core import registry
from fedforge.core.errors import ConfigError

SMALL = {
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 6,
    "client_fraction": 0.5,
    "rounds": 2,
    "local_epochs": 2,
    "batch_size": 8,
    "lr": 0.05,
    "dtype": "float64",
    "engine": "serial",
    "evaluation": {"every": 1},
}


class Proximal:
    """mu (w - w_t) added to each gradient, written out tensor by tensor."""

    def __init__(self, mu: float) -> None:
        self.mu = mu

    def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        for grad, w, anchor in zip(grads, ctx.params, ctx.anchor, strict=True):
            grad.add_(w - anchor, alpha=self.mu)


@dataclass(frozen=True)
class ProxOptions:
    mu: float = 0.01

    def check(self) -> None:
        if self.mu < 0:
            raise ValueError(f"mu = {self.mu} must be >= 0")


def my_prox(context: ComponentContext) -> Algorithm:
    cfg, mu = context.cfg, context.options.mu
    return Algorithm(
        "my_prox",
        DecayedPlan(local_plan(cfg), cfg.lr_decay),
        cross_entropy,
        grad_hook=Proximal(mu) if mu > 0 else None,
        drop_stragglers=drops_stragglers(cfg, False),
    )


class PlainMean:
    """The weighted mean of the rows, as a user would write it (not linear: it
    takes the whole cohort)."""

    name = "plain_mean"
    needs_individual = True
    linear = False

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return (weights / weights.sum()) @ updates

    def start(self, size: int, dtype: torch.dtype) -> Any:
        raise NotImplementedError


@pytest.fixture
def plugins() -> Iterator[None]:
    fedforge.register_algorithm("my_prox", my_prox, options=ProxOptions)
    fedforge.register_aggregator("plain_mean", lambda context: PlainMean())
    yield
    registry.unregister("algorithm", "my_prox")
    registry.unregister("aggregator", "plain_mean")


def _run(tmp_path: Path, **extra: Any) -> fedforge.RunResult:
    cfg = from_dict({**SMALL, "runs_dir": str(tmp_path), **extra})
    return fedforge.run(cfg, progress=False)


def test_builtins_are_registered_by_name() -> None:
    assert registry.names("algorithm")[:6] == (
        "fedavg", "fedsgd", "fedprox", "scaffold", "fedbn", "perfedavg"
    )  # fmt: skip
    assert {"mean", "median", "krum", "bulyan"} <= set(registry.names("aggregator"))
    assert set(registry.names("server_optimizer")) == {"sgd", "adagrad", "adam", "yogi"}
    assert {"dense", "int8", "sign", "topk", "randk"} <= set(registry.names("codec"))


def test_a_plugin_algorithm_runs_by_name_bit_identical_to_the_builtin(
    plugins: None, tmp_path: Path
) -> None:
    builtin = _run(tmp_path / "a", algorithm="fedprox", fedprox={"mu": 0.3})
    plugin = _run(tmp_path / "b", algorithm="my_prox", plugin_options={"my_prox": {"mu": 0.3}})
    assert plugin.params.dtype == torch.float64
    assert torch.equal(plugin.params, builtin.params)
    assert [r.test_loss for r in plugin.rounds] == [r.test_loss for r in builtin.rounds]
    fedavg = _run(tmp_path / "c", algorithm="fedavg")
    assert not torch.equal(fedavg.params, builtin.params)  # the term did something


def test_a_plugin_aggregator_matches_the_mean(plugins: None, tmp_path: Path) -> None:
    mean = _run(tmp_path / "a")
    plain = _run(tmp_path / "b", robust={"aggregator": "plain_mean"})
    torch.testing.assert_close(plain.params, mean.params, rtol=0, atol=1e-12)


def test_plugin_options_take_their_defaults(plugins: None) -> None:
    cfg = from_dict({**SMALL, "algorithm": "my_prox"})
    algorithm = fedforge.algorithms.from_config(cfg)
    assert isinstance(algorithm.grad_hook, Proximal) and algorithm.grad_hook.mu == 0.01


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mu": "lots"}, "config field 'plugin_options.my_prox.mu' = 'lots' is invalid"),
        ({"nu": 1.0}, "unknown config field 'plugin_options.my_prox.nu'; known fields: mu"),
        ({"mu": -1.0}, "config field 'plugin_options.my_prox' is invalid: mu = -1.0 must be"),
    ],
)
def test_bad_plugin_options_are_refused_in_one_line(
    plugins: None, options: dict[str, Any], message: str
) -> None:
    cfg = from_dict({**SMALL, "algorithm": "my_prox", "plugin_options": {"my_prox": options}})
    with pytest.raises(ConfigError) as exc:
        check_names(cfg)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_options_for_a_component_not_in_use_are_refused(plugins: None) -> None:
    cfg = from_dict({**SMALL, "plugin_options": {"my_prox": {"mu": 0.1}}})
    with pytest.raises(ConfigError, match=r"'plugin_options\.my_prox' .* those that do: none"):
        check_names(cfg)


def test_an_unknown_name_is_refused_in_one_line_with_the_registered_names() -> None:
    with pytest.raises(ConfigError) as exc:
        from_dict({**SMALL, "algorithm": "fednope"})
    line = str(exc.value)
    assert line.startswith("config field 'algorithm' = 'fednope' is invalid: must be a registered")
    assert "'fedavg', 'fedsgd', 'fedprox', 'scaffold', 'fedbn', 'perfedavg'" in line
    assert "\n" not in line
    for data, field in [
        ({"robust": {"aggregator": "avg"}}, "robust.aggregator"),
        ({"server_optimizer": {"kind": "lamb"}}, "server_optimizer.kind"),
        ({"communication": {"uplink": "zip"}}, "communication.uplink"),
    ]:
        with pytest.raises(ConfigError, match=f"config field '{field}' = "):
            from_dict({**SMALL, **data})
    with pytest.raises(ConfigError, match="^aggregator 'avg' is unknown: must be a registered"):
        registry.lookup("aggregator", "avg")


def test_a_second_registration_is_refused_unless_replaced() -> None:
    with pytest.raises(ConfigError, match="algorithm 'fedavg' is already registered"):
        fedforge.register_algorithm("fedavg", my_prox)
    fedforge.register_server_optimizer("twice", lambda c: None)
    try:
        with pytest.raises(ConfigError, match="server_optimizer 'twice' is already registered"):
            fedforge.register_server_optimizer("twice", lambda c: None)
        fedforge.register_server_optimizer("twice", lambda c: None, replace=True)
    finally:
        registry.unregister("server_optimizer", "twice")
    with pytest.raises(ConfigError, match="unknown component kind 'widget'"):
        fedforge.register("widget", "w", my_prox)
    with pytest.raises(ConfigError, match="options must be a dataclass"):
        fedforge.register_algorithm("x", my_prox, options=dict)


def test_a_factory_returning_nothing_is_named(tmp_path: Path) -> None:
    fedforge.register_server_optimizer("empty", lambda c: None)
    try:
        cfg = from_dict({**SMALL, "server_optimizer": {"kind": "empty"}})
        with pytest.raises(ConfigError, match="server_optimizer 'empty': its factory"):
            fedforge.server.optimizers.from_config(cfg)
    finally:
        registry.unregister("server_optimizer", "empty")


def test_asking_the_registry_imports_no_component() -> None:
    """The built-ins are registered by name: the names answer, and a config naming
    them is checked, without importing any component's module."""
    code = (
        "import sys, fedforge\n"
        "from fedforge.core import registry\n"
        "assert 'fedprox' in registry.names('algorithm')\n"
        "from fedforge.config import from_dict\n"
        "from_dict({'algorithm': 'scaffold', 'robust': {'aggregator': 'median'}})\n"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('fedforge.algorithms', 'fedforge.robust', 'fedforge.communication'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_models_and_tasks_of_the_caller_live_in_the_registry() -> None:
    def factory() -> torch.nn.Module:
        return torch.nn.Linear(60, 10)

    fedforge.register_model("reg_linear", factory)
    try:
        assert registry.lookup("model", "reg_linear").load() is factory
        fedforge.register_model("reg_linear", factory)  # again: replaced, as documented
    finally:
        registry.unregister("model", "reg_linear")
    assert "reg_linear" not in fedforge.models.MODELS

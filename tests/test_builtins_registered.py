"""Every built-in component is an entry of the one registry, registered as a
plugin's is: taking one out makes ``build`` refuse its name in one line (there is
no second place it is found), a plugin replaces one only by saying so, and a
plugin's model may be sized by the data as the built-in models are."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import fedforge as ff
from fedforge.config import Config
from fedforge.config.components import make
from fedforge.config.names import config_components
from fedforge.core import builtins, registry
from fedforge.core.errors import ConfigError, DataError
from fedforge.core.plugin_versions import used_plugins
from fedforge.models import ModelContext, build_model, check_model_name
from fedforge.tasks import resolve_task

SYNTHETIC = {"dataset": "synthetic", "model": "logreg", "num_clients": 4, "rounds": 1,
             "target_accuracy": None, "dtype": "float64"}  # fmt: skip
EVERY_BUILTIN = [(kind, name) for kind, table in builtins.TABLES.items() for name in table]


@pytest.fixture
def restores_builtins() -> Iterator[None]:
    """Whatever a test takes out or replaces, the built-ins are registered again after."""
    yield
    for kind, name in EVERY_BUILTIN:
        table, options = builtins.TABLES[kind], builtins.OPTIONS.get((kind, name))
        registry.register(kind, name, table[name], options=options, replace=True)


def test_every_kind_has_its_builtins_in_the_registry() -> None:
    kinds = {kind for kind, _ in EVERY_BUILTIN}
    assert {"model", "task", "stage"} <= kinds
    assert set(builtins.MODELS) == {"2nn", "cnn", "cnn_bn", "logreg", "char_lstm", "linear"}
    assert set(builtins.TASKS) == {
        "mnist-2nn", "mnist-cnn", "synthetic-logreg", "shakespeare-lstm", "linear-regression"
    }  # fmt: skip
    for kind, name in EVERY_BUILTIN:
        assert name in registry.names(kind) and registry.is_builtin(kind, name), (kind, name)
        assert callable(registry.lookup(kind, name).load()), (kind, name)


@pytest.mark.parametrize(
    ("kind", "name"), EVERY_BUILTIN, ids=[f"{k}-{n}" for k, n in EVERY_BUILTIN]
)
def test_a_builtin_taken_out_of_the_registry_is_unknown(
    restores_builtins: None, kind: str, name: str
) -> None:
    cfg = Config()  # checked against the registry before the name goes
    assert callable(registry.lookup(kind, name).load())
    registry.unregister(kind, name)
    with pytest.raises(ConfigError, match=f"^{kind} '{name}' is unknown") as info:
        make(kind, name, cfg)
    assert "\n" not in str(info.value)


def test_build_refuses_a_builtin_model_or_task_taken_out(restores_builtins: None) -> None:
    """The model and the task are found only in the registry: with the entry gone
    ``build`` refuses the name in one line, though the classes are all there."""
    registry.unregister("model", "logreg")
    with pytest.raises(ConfigError, match="^model 'logreg' is unknown; known models: 2nn") as info:
        ff.build(ff.config.from_dict(SYNTHETIC))
    assert "\n" not in str(info.value) and "logreg" not in str(info.value).split(";")[1]
    with pytest.raises(ConfigError, match="model 'logreg' is unknown"):
        build_model("logreg", 0, data="synthetic")
    registry.register("model", "logreg", builtins.MODELS["logreg"])
    registry.unregister("task", "synthetic-logreg")
    cfg = ff.config.from_dict({**SYNTHETIC, "task": "synthetic-logreg"})
    with pytest.raises(
        ConfigError, match="^task 'synthetic-logreg' is unknown; built in: mnist-2nn"
    ):
        ff.build(cfg)
    with pytest.raises(ConfigError, match="task 'synthetic-logreg' is unknown"):
        resolve_task(cfg)


def test_unknown_names_list_the_builtin_and_registered_ones_in_one_line() -> None:
    ff.register_model("own_linear", lambda: nn.Linear(60, 10))
    ff.register_task(ff.Task("own-task", "regression"))
    try:
        with pytest.raises(ConfigError) as model:
            check_model_name("nope")
        message = str(model.value)
        assert "\n" not in message and "'nope' is unknown" in message
        known = message.split("known models: ")[1].split(" (")[0].split(", ")
        assert sorted(known) == sorted([*builtins.MODELS, "own_linear"])
        with pytest.raises(ConfigError) as task:
            resolve_task(Config(task="nope"))
        message = str(task.value)
        assert "\n" not in message
        builtin = message.split("built in: ")[1].split(";")[0].split(", ")
        assert sorted(builtin) == sorted(builtins.TASKS)
        assert "; registered: own-task (" in message
    finally:
        registry.unregister("model", "own_linear"), registry.unregister("task", "own-task")


def test_a_builtin_name_is_replaced_only_when_asked(restores_builtins: None) -> None:
    with pytest.raises(ConfigError, match="'logreg' cannot be registered: it is a built-in model"):
        ff.register_model("logreg", lambda: nn.Linear(60, 10))
    with pytest.raises(
        ConfigError, match="'mnist-cnn' cannot be registered: it is a built-in task"
    ):
        ff.register_task(ff.Task("mnist-cnn"))
    with pytest.raises(ConfigError, match="already registered.*replace=True"):
        ff.register("model", "cnn", lambda: nn.Linear(60, 10))
    ff.register_model("logreg", lambda: nn.Linear(60, 3, bias=False), replace=True)
    assert not registry.is_builtin("model", "logreg")
    assert build_model("logreg", 0, data="synthetic").weight.shape == (3, 60)
    ff.register_task(ff.Task("mnist-cnn", "regression"), replace=True)
    assert resolve_task(Config(task="mnist-cnn")).kind == "regression"


def sized_linear(context: ModelContext) -> nn.Module:
    """A plugin's model sized by the data, as the built-in logistic regression is."""
    seen.append(context)
    return nn.Linear(context.data.input_features, context.data.outputs)


seen: list[ModelContext] = []


def test_a_plugin_model_sized_by_the_data_spec_runs(one_thread: None) -> None:
    """Given the data's spec, a factory sizes its layers; one linear layer over the
    synthetic data's 60 features and 10 classes draws the same initial weights and
    trains to the same numbers as the built-in logistic regression, one linear
    layer too."""
    seen.clear()
    plugin = ff.config.from_dict({**SYNTHETIC, "model": "sized_linear"})
    ff.register_model("sized_linear", sized_linear)
    try:
        initial = ff.build(plugin).initial_params
        got = ff.run(plugin, store=False)
    finally:
        registry.unregister("model", "sized_linear")
    assert torch.equal(initial, ff.build(ff.config.from_dict(SYNTHETIC)).initial_params)
    want = ff.run(ff.config.from_dict(SYNTHETIC), store=False)  # its fused kernel: not bitwise
    assert seen and seen[0].name == "sized_linear"
    assert seen[0].data.input_shape == (60,) and seen[0].data.outputs == 10
    assert got.params.numel() == 60 * 10 + 10
    torch.testing.assert_close(got.params, want.params, rtol=0, atol=1e-12)
    assert len(got.rounds) == 1


def test_a_factory_of_two_arguments_is_refused_in_one_line() -> None:
    ff.register_model("two_args", lambda a, b: nn.Linear(60, 10))  # type: ignore[misc]
    try:
        with pytest.raises(ConfigError, match="takes 2 arguments; it must take none or one"):
            build_model("two_args", 0, data="synthetic")
    finally:
        registry.unregister("model", "two_args")


def test_the_mnist_models_refuse_other_rows_by_name() -> None:
    with pytest.raises(DataError, match=r"rows of shape \(60,\) do not fit model 'cnn'"):
        build_model("cnn", 0, data="synthetic")


def test_naming_the_builtins_imports_none_of_them() -> None:
    """Registering and checking names stays lazy: the model and task modules load
    only when a run builds one."""
    code = (
        "import sys\n"
        "from fedforge.core import registry\n"
        "assert 'cnn' in registry.names('model') and 'mnist-2nn' in registry.names('task')\n"
        "from fedforge.config import from_dict\n"
        "from_dict({'task': 'shakespeare-lstm'})\n"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('fedforge.models', 'fedforge.tasks', 'fedforge.pipeline'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_a_section_builds_its_stage_by_name(restores_builtins: None) -> None:
    """``communication.clip_norm`` and ``robust.norm_gate`` place the stages
    registered as ``clip`` and ``norm_gate``: a plugin that replaces one is what the
    section builds; taken out, the section's run is refused in one line."""
    from fedforge.pipeline.clip import Clip

    cfg = ff.config.from_dict({**SYNTHETIC, "communication": {"clip_norm": 2.0},
                               "robust": {"norm_gate": 3.0}})  # fmt: skip
    built = ff.build(cfg)
    [clip] = [s for s in built.pipeline.client if isinstance(s, Clip)]
    assert clip.clip_norm == 2.0
    assert [s.name for s in built.pipeline.cohort] == ["norm_gate"]

    def halved(context: object) -> Clip:
        return Clip(cfg.communication.clip_norm / 2)  # type: ignore[operator]

    ff.register_stage("clip", halved, replace=True)
    [clip] = [s for s in ff.build(cfg).pipeline.client if isinstance(s, Clip)]
    assert clip.clip_norm == 1.0
    registry.unregister("stage", "norm_gate")
    with pytest.raises(ConfigError, match="^stage 'norm_gate' is unknown: must be a registered"):
        ff.build(cfg)


def test_a_pipeline_list_does_not_name_a_stage_its_section_places() -> None:
    with pytest.raises(ConfigError, match="'clip' is placed by communication.clip_norm") as info:
        ff.config.from_dict({"pipeline": {"client": ["clip"]}})
    assert "\n" not in str(info.value)


def test_a_builtin_model_name_replaced_is_checked_as_the_callers(restores_builtins: None) -> None:
    """The built-in ``cnn`` fits MNIST alone and is refused on the synthetic data
    at once; a plugin's ``cnn`` is checked against the data where it is built."""
    synthetic = {**SYNTHETIC, "model": "cnn"}
    with pytest.raises(ConfigError, match="model' = 'cnn' is invalid: does not fit dataset"):
        ff.config.from_dict(synthetic)
    ff.register_model("cnn", lambda: nn.Linear(60, 10), replace=True)
    assert ff.build(ff.config.from_dict(synthetic)).spec.size == 610


def test_a_plugin_replacing_a_section_stage_is_a_plugin_the_run_uses(
    restores_builtins: None, tmp_path: Path
) -> None:
    """What a run records of its plugins (build.json, a deployment's Hello and
    Join) names the plugin that replaced ``clip`` when the run clips."""
    plugin = tmp_path / "halved_clip.py"
    plugin.write_text(
        "import fedforge\n"
        "from fedforge.pipeline.clip import Clip\n"
        "fedforge.register_stage('clip', lambda c: Clip(c.cfg.communication.clip_norm / 2),\n"
        "                        replace=True)\n"
    )
    clipping = ff.config.from_dict({**SYNTHETIC, "communication": {"clip_norm": 2.0}})
    assert used_plugins(config_components(clipping)) == {}
    registry.load_plugin(str(plugin))
    [(name, (_, provides))] = used_plugins(config_components(clipping)).items()
    assert "halved_clip" in name and provides == "stage 'clip'"
    assert used_plugins(config_components(ff.config.from_dict(SYNTHETIC))) == {}


def test_a_task_factory_registered_as_any_component_is_given_the_context() -> None:
    """``register("task", ...)`` takes a factory of the ``ComponentContext``, as the
    built-in tasks' factory is: it is called with the run's config and the name."""

    def factory(context: ff.ComponentContext) -> ff.Task:
        return ff.Task(f"{context.name}@{context.cfg.dataset}", "regression")

    ff.register("task", "from-context", factory)
    try:
        task = resolve_task(Config(task="from-context", dataset="synthetic", model="logreg"))
    finally:
        registry.unregister("task", "from-context")
    assert (task.name, task.kind) == ("from-context@synthetic", "regression")
    with pytest.raises(ConfigError, match="'not-a-task': its factory returned str, not a"):
        ff.register("task", "not-a-task", lambda context: "a string")
        try:
            resolve_task(Config(task="not-a-task"))
        finally:
            registry.unregister("task", "not-a-task")

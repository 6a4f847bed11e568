"""Stages a config names (``pipeline.client``, ``pipeline.server``): the example
per-layer clipping (examples/layer_clip.py, on the public API) against one round
worked by hand in plain torch (float64) on the serial and the vectorised engine,
server stages on each upload, the cohort and the aggregate, a resume after a
kill, and the one-line refusals of what a stage cannot do (under secure
aggregation, between the clip and central DP noise, on the wrong side, returning
another kind of vector than it was given)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.named_parts import (
    CLIPPED,
    NORM,
    PARTS,
    C,
    D,
    config_for,
    examples,  # noqa: F401  (the fixture)
    initial,
    local,
    metric_rows,
    one_round,
    tiny_data,
)

import fedforge
from examples_loaded import EXAMPLES
from fedforge.config import from_dict
from fedforge.core.errors import ConfigError

pytestmark = pytest.mark.usefixtures("examples")  # loaded as --plugin loads them


@pytest.mark.parametrize("engine", ["serial", "vectorized"])
def test_layer_clip_is_one_hand_worked_round(tmp_path: Path, engine: str) -> None:
    data = tiny_data()
    w0 = initial(tmp_path, data)
    expected = one_round(w0, data, NORM)
    deltas = [local(w0, data.train_x[i], data.train_y[i]) - w0 for i in PARTS]
    assert all(float(d[: C * D].norm()) > NORM for d in deltas)  # the clip bites
    cfg = config_for(tmp_path, engine, **CLIPPED)
    assert fedforge.build(cfg, data=data).engine.name == engine  # no fallback
    result = fedforge.run(cfg, data=data)
    torch.testing.assert_close(result.params, expected, rtol=0, atol=1e-12)
    assert not result.rejected and not result.skipped


def test_server_stages_run_on_each_upload_and_on_the_aggregate(tmp_path: Path) -> None:
    """negate on every upload, then halve the mean: w0 - mean / 2."""
    data = tiny_data()
    w0 = initial(tmp_path, data)
    expected = w0 - (one_round(w0, data, NORM) - w0) / 2
    server = {**CLIPPED, "pipeline": {"client": ["layer_clip"], "server": ["halve", "negate"]}}
    exp = fedforge.build(config_for(tmp_path, **server), data=data)
    assert exp.pipeline.describe() == (
        "client: local_training -> layer_clip -> encode:dense | server: decode:dense -> "
        "negate -> weighted_mean -> halve -> server_optimizer"
    )
    result = fedforge.run(config_for(tmp_path, **server), data=data)
    torch.testing.assert_close(result.params, expected, rtol=0, atol=1e-12)


def test_a_linear_upload_stage_runs_on_the_sum_under_secure_aggregation(tmp_path: Path) -> None:
    """negate on the unmasked sum: the same step as without the stage, reversed (to
    the fixed-point encoding's rounding)."""
    data = tiny_data()
    w0 = initial(tmp_path, data)
    masked = {"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}}
    plain = fedforge.run(config_for(tmp_path / "plain", **masked), data=data)
    negated = fedforge.run(
        config_for(tmp_path / "negated", pipeline={"server": ["negate"]}, **masked), data=data
    )
    assert float((plain.params - w0).norm()) > 0.1
    torch.testing.assert_close(negated.params - w0, -(plain.params - w0), rtol=0, atol=1e-6)


def test_a_cohort_stage_refuses_with_its_name(tmp_path: Path) -> None:
    data = tiny_data()
    result = fedforge.run(config_for(tmp_path, pipeline={"server": ["drop_first"]}), data=data)
    assert [(r, c, why) for r, c, why in result.rejected] == [(0, 0, "drop_first: first")]


def test_a_run_with_named_stages_and_metrics_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed as round 3 of 3 starts (a checkpoint after each round), resumed: the
    uninterrupted run's parameters and metric rows, bit for bit."""
    from tests.conftest import wrap_engine

    from fedforge.engines import SimulationEngine

    class Killed(SimulationEngine):
        name = "killed"

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def run_cohort(self, tasks: Any, payload: bytes) -> Any:
            if tasks[0].round_idx == 2:
                raise MemoryError("killed (test)")
            return self.inner.run_cohort(tasks, payload)

    data = tiny_data()
    extra = {
        **CLIPPED,
        "pipeline": {"client": ["layer_clip"], "server": ["halve"]},
        "rounds": 3,
        "checkpoint_every": 1,
        "evaluation": {"metrics": ["macro_f1"]},
        "client_fraction": 0.67,
    }
    want = fedforge.run(config_for(tmp_path / "whole", **extra), data=data)
    cfg = config_for(tmp_path / "killed", **extra)
    with monkeypatch.context() as patch:
        wrap_engine(patch, Killed)
        with pytest.raises(MemoryError):
            fedforge.run(cfg, data=data)
    (run_dir,) = Path(cfg.runs_dir).iterdir()
    got = fedforge.resume(run_dir, data=data)
    assert torch.equal(got.params, want.params)
    assert metric_rows(got) == metric_rows(want)


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (
            {"pipeline": {"client": ["halve"]}},
            "pipeline.client: stage 'halve' runs on 'server_aggregate'; pipeline.client takes "
            "stages that run on 'client' (name it under pipeline.server)",
        ),
        (
            {"pipeline": {"server": ["layer_clip"]}},
            "pipeline.server: stage 'layer_clip' runs on 'client'",
        ),
        (
            {"pipeline": {"server": ["drop_first"]}, "privacy": {"secagg": True}},
            "secure aggregation hides each update, so the per-upload/cohort gate 'drop_first' "
            "cannot see it (it needs the individual updates)",
        ),
        (
            {"pipeline": {"server": ["square"]}, "privacy": {"secagg": True}},
            "server upload stage 'square' is not linear: it cannot run on a sum",
        ),
        (
            {
                "pipeline": {"server": ["negate"]},
                "privacy": {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0},
            },
            "server upload stage 'negate' runs between 'clip' and 'central_dp': the noise is "
            "calibrated to the clipped norm",
        ),
        (
            {
                "pipeline": {"server": ["shrink"]},
                "privacy": {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0},
            },
            "cohort stage 'shrink' (role 'other': it may rewrite updates) runs between 'clip' "
            "and 'central_dp'",
        ),
        (
            {"pipeline": {"client": ["layer_clip", "layer_clip"]}},
            "config field 'pipeline.client' = ['layer_clip', 'layer_clip'] is invalid: names "
            "layer_clip more than once",
        ),
        ({"pipeline": {"client": ["nope"]}}, "config field 'pipeline.client' = 'nope'"),
        (
            {"evaluation": {"metrics": ["nope"]}},
            "config field 'evaluation.metrics' = 'nope' is invalid: must be a ",
        ),
    ],
)
def test_what_a_named_stage_cannot_do_is_refused_in_one_line(
    tmp_path: Path, extra: dict[str, Any], line: str
) -> None:
    extra.setdefault("communication", {"clip_norm": 1.0})  # secure aggregation's bound
    if "privacy" in extra and extra["privacy"].get("dp") == "central":
        extra.pop("communication")
    with pytest.raises(ConfigError) as info:
        fedforge.build(config_for(tmp_path, **extra), data=tiny_data())
    assert line in str(info.value) and "\n" not in str(info.value)


def test_dp_noise_composes_with_stages_before_the_clip_and_on_the_noised_aggregate(
    tmp_path: Path,
) -> None:
    priv = {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0}
    extra = {
        **CLIPPED,
        "pipeline": {"client": ["layer_clip"], "server": ["halve", "drop_first"]},
        "privacy": priv,
    }
    exp = fedforge.build(config_for(tmp_path, **extra), data=tiny_data())
    assert exp.pipeline.describe() == (
        "client: local_training -> layer_clip -> clip -> encode:dense | server: "
        "decode:dense -> drop_first -> dp_mean -> central_dp -> halve -> server_optimizer"
    )


def test_a_stage_returning_another_kind_of_vector_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"client stage 'to_half' returned \(\d+,\) torch\."
        r"float16; a stage returns the update's \(\d+,\) torch\.float64",
    ):
        fedforge.run(config_for(tmp_path, pipeline={"client": ["to_half"]}), data=tiny_data())


def test_the_example_configs_read_with_their_plugins() -> None:
    import yaml

    from fedforge.config.components import check_names

    clip = from_dict(yaml.safe_load((EXAMPLES / "layer_clip.yaml").read_text()))
    f1 = from_dict(yaml.safe_load((EXAMPLES / "macro_f1.yaml").read_text()))
    for cfg in (clip, f1):
        check_names(cfg)  # every name registered, the options parsed
    assert clip.pipeline.client == ("layer_clip",) and f1.evaluation.metrics == (
        "macro_f1",
        "accuracy",
    )

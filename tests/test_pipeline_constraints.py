"""The pipeline's checks are the constraints its stages and codec declare: each
kind refuses a pipeline that violates it (the privacy and cohort-order kinds
are also tested beside their stages, in test_privacy_secagg, test_privacy_distributed,
test_robust_gates and test_report_weights); nothing is registered by importing
a module, and no stage is taken for another kind by its name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fedforge.aggregation.mean import WeightedMean
from fedforge.core.errors import ConfigError
from fedforge.pipeline.clip import Clip
from fedforge.pipeline.constraints import ShowsOnlySum, Unusable
from fedforge.pipeline.pipeline import (
    CohortUpdates,
    Constraint,
    Part,
    Pipeline,
    Role,
    StageContext,
    Where,
)
from fedforge.privacy.dp import CentralNoise, DistributedNoise, DPMean, LocalNoise
from fedforge.robust import Median
from fedforge.robust.gates import NormGate

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass
class _Stage:
    """A custom vector stage: it is whatever it declares, whatever its name."""

    name: str
    where: Where = "client"
    role: Role = "other"
    linear: bool = True
    constraints: tuple[Constraint, ...] = ()

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        return vec


@dataclass
class _CohortStage:
    name: str
    where: Where = "server_cohort"
    constraints: tuple[Constraint, ...] = ()

    def apply(
        self, cohort: CohortUpdates, ctx: StageContext
    ) -> tuple[CohortUpdates, list[tuple[int, str]]]:
        return cohort, []


class _Codec:
    """A stand-in codec (never encodes here) with the given name and constraints."""

    linear = True
    lossy = True

    def __init__(self, name: str, constraints: tuple[Constraint, ...] = ()) -> None:
        self.name, self.constraints = name, constraints


class _NamedDPMean(WeightedMean):
    name = "dp_mean"  # named like the DP mean, but example-count weights


# ------------------------------------------------------------ the pipeline's shape
def test_a_stage_placed_where_it_does_not_run_is_refused() -> None:
    late = _Stage("late", where="server_aggregate")
    with pytest.raises(ConfigError, match="'late' runs on 'server_aggregate' but was placed in"):
        Pipeline(WeightedMean(), client=(late,))


def test_a_stage_name_twice_is_refused() -> None:
    twice = (_Stage("same"),), (_Stage("same", where="server_upload"),)
    with pytest.raises(ConfigError, match="stages appear twice: same"):
        Pipeline(WeightedMean(), client=twice[0], server_upload=twice[1])


# -------------------------------------------------- secure aggregation (ShowsOnlySum)
MASKED = _Codec("masked", (ShowsOnlySum(),))  # any name: the declaration counts


def test_secure_aggregation_refuses_cohort_stages_and_nonlinear_stages() -> None:
    clip = Clip(1.0)
    with pytest.raises(ConfigError, match="gate 'norm_gate' cannot see it"):
        Pipeline(WeightedMean(), client=(clip,), codec=MASKED, cohort=(NormGate(),))  # type: ignore[arg-type]
    upload = _Stage("unpack", where="server_upload", linear=False)
    with pytest.raises(ConfigError, match="upload stage 'unpack' is not linear"):
        Pipeline(WeightedMean(), client=(clip,), codec=MASKED, server_upload=(upload,))  # type: ignore[arg-type]
    rounding, noise = _Stage("rounding", linear=False), LocalNoise(1.0, 1.0)
    with pytest.raises(ConfigError, match="'rounding' between DP and the secure-aggregation mask"):
        Pipeline(WeightedMean(), client=(clip, noise, rounding), codec=MASKED)  # type: ignore[arg-type]
    Pipeline(WeightedMean(), client=(rounding, clip, noise), codec=MASKED)  # type: ignore[arg-type]


def test_a_codec_that_cannot_work_is_refused_with_its_reason() -> None:
    from fedforge.privacy.secagg_codec import SecAggCodec, SecAggMean

    wraps = SecAggCodec(1e9, 10_000, 40, 0.5, [1])  # the sum needs a modulus over 64 bits
    with pytest.raises(ConfigError, match="pipeline refused: .*64"):
        Pipeline(SecAggMean(), client=(Clip(1.0),), codec=wraps)
    with pytest.raises(ConfigError, match="pipeline refused: it cannot"):
        Pipeline(WeightedMean(), codec=_Codec("broken", (Unusable("it cannot"),)))  # type: ignore[arg-type]


def test_a_custom_stage_brings_its_own_constraint() -> None:
    @dataclass(frozen=True)
    class NeedsFriend:
        friend: str

        def check(self, pipeline: Pipeline, owner: Part) -> str | None:
            names = [s.name for s in pipeline.client]
            return None if self.friend in names else f"'{owner.name}' wants '{self.friend}'"

    lonely = _Stage("lonely", constraints=(NeedsFriend("friend"),))
    with pytest.raises(ConfigError, match="'lonely' wants 'friend'"):
        Pipeline(WeightedMean(), client=(lonely,))
    Pipeline(WeightedMean(), client=(_Stage("friend"), lonely))


# ------------------------------------------------------------------- not by name
def test_a_stage_named_like_another_kind_is_not_that_kind() -> None:
    like_noise = (_Stage("dp_something"), _Stage("local_dp"), _Stage("clip+ef"))
    Pipeline(WeightedMean(), client=like_noise)  # no clip needed: none of them adds noise
    Pipeline(WeightedMean(), server_aggregate=(_Stage("central_dp", "server_aggregate"),))
    with pytest.raises(ConfigError, match="no client stage clips"):  # a 'clip' that does not
        Pipeline(WeightedMean(), client=(_Stage("clip"), LocalNoise(1.0, 1.0)))
    cohort = (_CohortStage("weights:class"), NormGate(), _CohortStage("attack:alie"))
    Pipeline(WeightedMean(), cohort=cohort)


def test_a_codec_or_aggregator_named_like_another_is_not_it() -> None:
    named_secagg = _Codec("secagg")  # does not declare that the server sees only the sum
    Pipeline(Median(), client=(Clip(1.0),), codec=named_secagg)  # type: ignore[arg-type]
    noise = DistributedNoise(1.0, 1.0, 4)
    with pytest.raises(ConfigError, match="without secure aggregation \\(codec 'secagg'\\)"):
        Pipeline(DPMean(1.0), client=(Clip(1.0), noise), codec=named_secagg)  # type: ignore[arg-type]
    central = (CentralNoise(1.0, 1.0, 1.0),)
    with pytest.raises(ConfigError, match="aggregator 'dp_mean': .*weight cap"):
        Pipeline(_NamedDPMean(), client=(Clip(1.0),), server_aggregate=central)


# ------------------------------------------------------ nothing registered on import
VERDICTS = """
import json, sys
from fedforge.aggregation.mean import WeightedMean
from fedforge.pipeline.clip import Clip
from fedforge.core.errors import ConfigError
from fedforge.pipeline.pipeline import Pipeline
from fedforge.privacy.dp import CentralNoise, DistributedNoise, DPMean, LocalNoise
from fedforge.robust import Median
from fedforge.robust.attacks import Collusion
from fedforge.robust.gates import NormGate
from fedforge.client.reports import ReportWeights

clip, noise = Clip(1.0), LocalNoise(1.0, 1.0)
cases = {
    "fine": lambda: Pipeline(WeightedMean(), client=(clip, noise)),
    "noise_first": lambda: Pipeline(WeightedMean(), client=(noise, clip)),
    "no_clip": lambda: Pipeline(DPMean(1.0), server_aggregate=(CentralNoise(1.0, 1.0, 1.0),)),
    "unmasked": lambda: Pipeline(DPMean(1.0), client=(clip, DistributedNoise(1.0, 1.0, 4))),
    "counted": lambda: Pipeline(
        WeightedMean(), client=(clip,), server_aggregate=(CentralNoise(1.0, 1.0, 1.0),)
    ),
    "late_collusion": lambda: Pipeline(
        Median(), cohort=(NormGate(), Collusion("alie", frozenset()))
    ),
    "early_weights": lambda: Pipeline(
        WeightedMean(), cohort=(ReportWeights("class"), NormGate())
    ),
}
verdicts = {}
for name, make in cases.items():
    try:
        make()
        verdicts[name] = "built"
    except ConfigError as exc:
        verdicts[name] = str(exc)
loaded = sorted(m for m in sys.modules if m.startswith("fedforge"))
print(json.dumps({"verdicts": verdicts, "loaded": loaded}))
"""

# only the stages' own modules: the package's __init__ (which imports everything) is skipped
ONLY_STAGES = f"""
import sys, types
package = types.ModuleType("fedforge")
package.__path__ = [{str(SRC / "fedforge")!r}]
sys.modules["fedforge"] = package
"""

EVERYTHING = """
import importlib, pkgutil
import fedforge
for module in pkgutil.walk_packages(fedforge.__path__, "fedforge."):
    importlib.import_module(module.name)
"""


def _verdicts(prelude: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", prelude + VERDICTS],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_importing_modules_registers_nothing() -> None:
    alone, everything = _verdicts(ONLY_STAGES), _verdicts(EVERYTHING)
    for assembler in (
        "fedforge.privacy.parts",
        "fedforge.robust.parts",
        "fedforge.server.experiment",
    ):
        assert assembler not in alone["loaded"]  # type: ignore[operator]
        assert assembler in everything["loaded"]  # type: ignore[operator]
    assert alone["verdicts"] == everything["verdicts"]
    verdicts: dict[str, str] = alone["verdicts"]  # type: ignore[assignment]
    assert verdicts.pop("fine") == "built"
    assert all(v.startswith("pipeline refused: ") for v in verdicts.values()), verdicts

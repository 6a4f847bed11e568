"""The validation split carved from the training data (evaluation.validation):
disjoint from the clients' training indices and the same across runs, per client
and central; a run's target and the benchmarks' rounds to target read the
validation accuracy, recomputed here from the carved rows; a bad fraction
refused in one line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedforge
from fedforge.config import from_dict
from fedforge.core.errors import ConfigError
from fedforge.data.partition import Partition
from fedforge.evaluation.evaluate import evaluate
from fedforge.evaluation.validation import carve_validation
from fedforge.server.experiment import build
from fedforge.store import RunStore

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _partition() -> Partition:
    rng = np.random.default_rng(0)
    order = rng.permutation(100)
    return Partition((np.sort(order[:10]), np.sort(order[10:40]), np.sort(order[40:100])))


@pytest.mark.parametrize("split", ["per_client", "central"])
def test_validation_rows_leave_the_training_indices_and_are_stable(split: str) -> None:
    """Clients of 10, 30 and 60 examples, 20% carved: per client 2, 6 and 12 of each
    client's own; central 20 of the pooled 100. No validation index is a training
    index, together they are the original 100, and a second carve is identical."""
    part = _partition()
    keep, held = carve_validation(part, 0.2, split, seed=4)
    trained = np.concatenate(keep.client_indices)
    assert len(np.intersect1d(trained, held)) == 0
    assert sorted([*trained.tolist(), *held.tolist()]) == list(range(100))
    assert len(held) == 20
    if split == "per_client":
        assert [len(k) for k in keep.client_indices] == [8, 24, 48]
        for own, kept in zip(part.client_indices, keep.client_indices, strict=True):
            assert len(np.intersect1d(own, held)) == len(own) - len(kept)
    again_keep, again_held = carve_validation(part, 0.2, split, seed=4)
    assert np.array_equal(again_held, held)
    for a, b in zip(again_keep.client_indices, keep.client_indices, strict=True):
        assert np.array_equal(a, b)
    assert not np.array_equal(carve_validation(part, 0.2, split, seed=5)[1], held)


def _cfg(tmp_path: Path, **extra: Any) -> Any:
    base: dict[str, Any] = {
        "dataset": "synthetic",
        "model": "logreg",
        "num_clients": 6,
        "client_fraction": 0.5,
        "batch_size": None,
        "rounds": 12,
        "target_accuracy": None,
        "dtype": "float64",
        "engine": "serial",
        "seed": 2,
        "runs_dir": str(tmp_path),
    }
    return from_dict({**base, **extra})


def _common() -> Any:
    spec = importlib.util.spec_from_file_location("benchmarks_common", BENCHMARKS / "_common.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_target_and_rounds_to_target_read_the_validation_accuracy(tmp_path: Path) -> None:
    """A run with 25% of each client's data carved for validation: the built
    experiment's clients hold none of the validation rows (those carve_validation
    picks here), the final model's validation accuracy recomputed on those rows is
    the one recorded, the run stops at the first evaluation whose validation
    accuracy reaches the target, and the benchmarks' rounds to target read the
    validation curve, not the test one."""
    cfg = _cfg(tmp_path, evaluation={"validation": 0.25})
    plain = build(_cfg(tmp_path))
    keep, held = carve_validation(plain.data.partition, 0.25, "per_client", 2)
    exp = build(cfg)
    assert np.array_equal(exp.data.validation, held)
    for a, b in zip(exp.data.partition.client_indices, keep.client_indices, strict=True):
        assert np.array_equal(a, b)
        assert len(np.intersect1d(a, held)) == 0
    first = fedforge.run(cfg)
    with RunStore.open(first.run_dir) as store:
        val = [
            (int(r), v) for r, n, v in store.read_rows("eval_metrics") if n == "validation_accuracy"
        ]
        tests = [r.test_accuracy for r in store.rounds()]
    assert len(val) == 12
    x, y = exp.data.validation_data() or (None, None)
    assert x is not None and len(y) == len(held)
    recomputed = evaluate(exp.model, exp.spec, first.params, x, y).accuracy
    assert val[-1][1] == pytest.approx(recomputed, abs=1e-12)
    assert any(abs(v - t) > 1e-9 for (_, v), t in zip(val, tests, strict=True))
    # a target reached on validation at a round where the test accuracy differs
    target = sorted(v for _, v in val)[len(val) // 2]
    stop = next(r for r, v in val if v >= target)
    stopped = fedforge.run(
        _cfg(tmp_path / "t", evaluation={"validation": 0.25}, target_accuracy=target)
    )
    with RunStore.open(stopped.run_dir) as store:
        assert len(store.rounds()) == stop + 1
    common = _common()
    rec = common._read(first.run_dir, cfg, target)
    assert rec["target_read"] == "validation"
    assert rec["rounds_to_target"] <= stop + 1
    assert rec["rounds_to_target"] > stop  # interpolated within the round that reached it
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, evaluation={"validation": 1.0})
    assert "\n" not in str(err.value) and "evaluation.validation" in str(err.value)

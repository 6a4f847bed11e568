"""Clients with their own learning rates (``local.lr_rule``) train in one chunk
of the vectorised engine, and each client's update is the one the serial engine
computes at its lr: float64, to 1e-9, on every path (the fused perceptron step
with and without FedProx's and SCAFFOLD's terms, the vmap path's plain step and
its general step with momentum, clients with their own clip bounds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.test_vectorized import synthetic_data

from fedforge import config as config_mod
from fedforge.server.loop import run

SCALES = "client_id,lr_scale\n0,0.5\n1,2\n3,0.25\n4,3\n5,1.5\n"  # client 2: 1


def chunk_calls(monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[float]], list[bool]]:
    """The clients' learning rates of every chunk the vectorised engine trains,
    and for each call of the fused perceptron path whether it had per-client rates."""
    from fedforge.engines import vectorized

    calls: list[list[float]] = []
    fused: list[bool] = []
    real, real_fused = vectorized.vectorized_local_sgd, vectorized.batched_mlp_sgd

    def recording(*args: Any, **kw: Any) -> Any:
        calls.append(list(kw["lrs"] if "lrs" in kw else args[12]))
        return real(*args, **kw)

    def recording_fused(*args: Any, **kw: Any) -> Any:
        fused.append(isinstance(args[7], torch.Tensor))
        return real_fused(*args, **kw)

    monkeypatch.setattr(vectorized, "vectorized_local_sgd", recording)
    monkeypatch.setattr(vectorized, "batched_mlp_sgd", recording_fused)
    return calls, fused


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("2nn", {}),  # the fused step
        ("2nn", {"algorithm": "fedprox", "fedprox": {"mu": 0.5}}),  # its proximal term
        ("2nn", {"algorithm": "scaffold"}),  # its per-client shift
        ("2nn", {"local": {"momentum": 0.9}}),  # the vmap path's general step
        ("cnn", {}),  # the vmap path's plain step
        # sped-up clients' own clip bounds (from round 2) in the same chunk
        (
            "2nn",
            {"local": {"lr_rule_scales_bounds": True}, "communication": {"clip_multiple": 0.5}},
        ),
    ],
)
def test_clients_with_their_own_lr_share_a_chunk_and_equal_serial(
    model: str, extra: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    csv = tmp_path / "scales.csv"
    csv.write_text(SCALES)
    local = {**extra.pop("local", {}), "lr_rule": "lr_csv"}
    base = config_mod.from_dict(
        {
            "model": model,
            "num_clients": 6,
            "client_fraction": 0.5,
            "local_epochs": 2,
            "batch_size": 4,
            "lr": 0.05,
            "rounds": 3,
            "target_accuracy": None,
            "evaluation": {"every": 3},
            "dtype": "float64",
            "local": local,
            "plugin_options": {"lr_csv": {"path": str(csv)}},
            "robust": {"max_norm_multiple": None},  # every update taken: all compared
            **extra,
        }
    )
    data = synthetic_data(6, "quantity", seed=5)
    serial = run(config_mod.override(base, {"engine": "serial"}), data=data, store=False)
    calls, fused = chunk_calls(monkeypatch)
    vector = run(config_mod.override(base, {"engine": "vectorized"}), data=data, store=False)
    assert vector.summary["engine"] == "vectorized"
    assert len(calls) == 3, calls  # one chunk a round, its clients' lrs differing
    assert all(len(set(lrs)) > 1 for lrs in calls), calls
    takes_fused = model == "2nn" and "momentum" not in local
    assert fused == ([True] * 3 if takes_fused else []), fused
    torch.testing.assert_close(vector.params, serial.params, rtol=0, atol=1e-9)
    for a, b in zip(serial.rounds, vector.rounds, strict=True):
        assert a.train_loss == pytest.approx(b.train_loss, abs=1e-12)
    plain = run(
        config_mod.override(
            base,
            {
                "engine": "serial",
                "local.lr_rule": None,
                "local.lr_rule_scales_bounds": False,
                "plugin_options": {},
            },
        ),
        data=data,
        store=False,
    )
    assert (plain.params - serial.params).abs().max() > 1e-6  # the scales matter here
    if base.local.lr_rule_scales_bounds:  # and so do the scaled clip bounds
        held = config_mod.override(base, {"engine": "serial", "local.lr_rule_scales_bounds": False})
        assert (run(held, data=data, store=False).params - serial.params).abs().max() > 1e-6

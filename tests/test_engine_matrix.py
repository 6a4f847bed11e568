"""The engine contract across the features: serial and vectorised (and a few
worker pools) give the same final parameters in float64 to 1e-9, for algorithms,
server optimizers, stragglers, codecs, privacy, robust aggregation under attack,
report weights, groups and upload periods; and one engine run twice is bit-
identical. Tiny runs: 8 uneven clients, 2 rounds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conftest import MakeData
from fedforge import config as config_mod
from fedforge.data.federated import FederatedData
from fedforge.server.experiment import build
from fedforge.server.loop import run

SIZES = [7, 12, 5, 9, 10, 6, 8, 11]
BASE = {
    "model": "2nn", "num_clients": len(SIZES), "client_fraction": 0.75, "local_epochs": 2,
    "batch_size": 4, "lr": 0.05, "rounds": 2, "target_accuracy": None, "evaluation": {"every": 2},
    "dtype": "float64", "checkpoint_every": 0,
}  # fmt: skip

CELLS: dict[str, dict[str, Any]] = {
    "fedsgd": {"algorithm": "fedsgd"},
    "scaffold with momentum": {"algorithm": "scaffold", "local.momentum": 0.5},
    "fedadam": {"server_optimizer.kind": "adam", "server_optimizer.lr": 0.01},
    "fedyogi": {"server_optimizer.kind": "yogi", "server_optimizer.lr": 0.01},
    "stragglers kept": {"stragglers.fraction": 0.5, "stragglers.drop": False, "local_epochs": 3},
    "upload every 2": {"communication.upload_every": 2, "rounds": 4},
    "int4 stochastic": {"communication.uplink": "int4"},
    "randk per client": {
        "communication.uplink": "randk", "communication.fraction": 0.1,
        "communication.randk_per_client": True,
    },
    "sign with error feedback": {
        "communication.uplink": "sign", "communication.rounding": "nearest",
        "communication.error_feedback": True,
    },
    "int8 downlink": {"communication.downlink": "int8"},
    "local dp": {"privacy.dp": "local", "privacy.noise_multiplier": 0.5, "privacy.clip_norm": 1.0},
    "central dp, adaptive clip": {
        "privacy.dp": "central", "privacy.noise_multiplier": 0.5, "privacy.adaptive_clip": True,
    },
    "secure aggregation with dropouts": {
        "privacy.secagg": True, "communication.clip_norm": 1.0,
        "privacy.secagg_drop_masked_input": 0.2,
    },
    "median under alie": {
        "robust.aggregator": "median", "robust.attack": "alie", "robust.attack_fraction": 0.25,
    },
    "multi-krum under gaussian": {
        "robust.aggregator": "multi_krum", "robust.byzantine": 1, "robust.attack": "gaussian",
        "robust.attack_fraction": 0.25,
    },
    "class weights": {"aggregation": {"weights": "class"}},
    "groups": {"communication.groups": 3},
    "eval clients, label noise": {"evaluation.clients": True, "partition.label_noise": 0.25},
}  # fmt: skip
POOLED = ("stragglers kept", "int4 stochastic", "median under alie")


def _run(data: FederatedData, changes: dict[str, Any], engine: str, workers: int = 1) -> Any:
    cfg = config_mod.override(config_mod.from_dict(BASE), {**changes, "engine": engine})
    return run(config_mod.override(cfg, {"workers": workers}), data=data, store=False)


@pytest.mark.all_cores
@pytest.mark.parametrize("cell", list(CELLS))
def test_engines_agree_in_float64(cell: str, make_data: MakeData, one_thread: None) -> None:
    data = make_data(SIZES, dtype=torch.float64)
    changes = CELLS[cell]
    serial = _run(data, changes, "serial")
    vector = _run(data, changes, "vectorized")
    assert serial.summary["engine"] == "serial" and vector.summary["engine"] == "vectorized"
    cfg = config_mod.override(config_mod.from_dict(BASE), changes)
    moved = (serial.params - build(cfg, data).initial_params).abs().max().item()
    assert moved > 1e-4  # training changed the model
    assert len(serial.rounds) == len(vector.rounds) == cfg.rounds
    diff = (serial.params - vector.params).abs().max().item()
    assert diff < 1e-9, diff
    assert torch.equal(_run(data, changes, "vectorized").params, vector.params)  # bit for bit
    if cell in POOLED:
        pooled = _run(data, changes, "serial", workers=2)
        assert pooled.summary["engine"] == "serialx2"
        assert torch.equal(pooled.params, serial.params)

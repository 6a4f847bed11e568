"""Each client's own learning rate and the round's clip bound travel in the
round's TRAIN work to real client processes: the deployment ends where the
simulator ends with the same scales and clip, and away from where it ends
without them. With ``local.lr_rule_scales_bounds`` the scaled clip bounds
travel too (the client processes build their experiment without the rule)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy_procs import run_dir_of, start_client, start_server, write_config
from fedforge import config as config_mod
from fedforge import run
from fedforge.store.final import load_final


@pytest.mark.parametrize("scaled", [False, True], ids=["round_bounds", "scaled_bounds"])
def test_a_deployment_trains_each_client_at_its_scaled_lr_and_clips(
    tmp_path: Path, scaled: bool
) -> None:
    scales = tmp_path / "scales.csv"
    scales.write_text("client_id,lr_scale\n0,0.2\n1,4\n3,2.5\n4,0.5\n")
    cfg = write_config(
        tmp_path / "cfg.yaml",
        rounds=2,
        client_fraction=1.0,  # clients 1 and 3, sped up, train in round 2 (the clip's first)
        checkpoint_every=0,
        local={"lr_rule": "lr_csv", "lr_rule_scales_bounds": scaled},
        plugin_options={"lr_csv": {"path": str(scales)}},
        communication={"clip_multiple": 0.4},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
    assert server.wait(120) == 0, server.log.read_text()
    for c in clients:
        assert c.wait(60) == 0, c.log.read_text()
    deployed = load_final(tmp_path / run_dir_of(server))["params"]
    base = config_mod.load(cfg)
    sim = config_mod.override(base, {"runs_dir": str(tmp_path / "sim"), "engine": "serial"})
    assert (deployed - run(sim).params).abs().max().item() <= 1e-9
    no_rule = {"local.lr_rule": None, "local.lr_rule_scales_bounds": False, "plugin_options": {}}
    others = [no_rule, {"communication.clip_multiple": None}]
    others += [{"local.lr_rule_scales_bounds": not scaled}]  # the flag matters here
    for k, off in enumerate(others):
        other = config_mod.override(sim, {**off, "runs_dir": str(tmp_path / f"sim{k}")})
        assert (deployed - run(other).params).abs().max().item() > 1e-4, off

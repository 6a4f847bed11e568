"""One lying client in a real deployment (a ``fedforge server`` and client
processes on loopback) decides no canary: its reports pass the field checks
or are refused with the reason, and the judge's median leaves it no say."""

from __future__ import annotations

import sys
from pathlib import Path

from deploy_procs import run_dir_of, start_client, start_process, start_server, write_config
from fedforge import config as config_mod
from fedforge.evaluation.evaluate import evaluate
from fedforge.server.experiment import build
from fedforge.store import RunStore
from fedforge.store import versions as vs
from fedforge.transport.canary import CanaryJudge, CanaryPolicy
from fedforge.transport.hosted import evaluation_data

LIAR = Path(__file__).with_name("lying_client.py")


def _honest_decision(cfg: Path, store: RunStore, version: vs.ModelVersion) -> str:
    """What the judge decides of ``version`` from every client's true scores of it
    and of its parent (evaluated here, as each client evaluates its own rows)."""
    exp = build(config_mod.load(cfg))
    dep = exp.cfg.deployment
    policy = CanaryPolicy(1.0, "loss", dep.canary_max_drop, 6, higher_is_better=False)
    assert version.parent_id is not None
    judge = CanaryJudge(policy, version.version_id, version.parent_id)
    for vid in (version.version_id, version.parent_id):
        params = vs.load_version_params(store, vid)
        for c in range(6):
            x, y = evaluation_data(exp, c)
            ev = evaluate(
                exp.model, exp.spec, params, x, y, exp.cfg.evaluation.batch_size, exp.metrics
            )
            assert judge.report(c, vid, {"loss": ev.loss}, len(y)) is None
    return judge.decide().kind


def test_one_lying_client_flips_no_canary(tmp_path: Path) -> None:
    """Six clients, every round's model a candidate judged by all six on the loss
    (at most 0.001 worse). Clients 0-4 are honest; client 5 reports a loss of
    10^6 on each candidate and 0 on the serving version (an example-weighted
    mean would roll every candidate back) and a cold-start accuracy of -10^9.
    Each decision is the one the six clients' true scores make (computed here
    from the stored versions), a promotion among them; the cold start is
    refused with its reason."""
    dep = {
        "canary_every": 1,
        "canary_fraction": 1.0,
        "canary_metric": "loss",
        "canary_max_drop": 0.001,
        "canary_min_reports": 6,
        "cold_start": True,
    }
    cfg = write_config(tmp_path / "cfg.yaml", rounds=3, deployment=dep)
    server, port = start_server(tmp_path, cfg, "--insecure")
    honest = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-4")]
    liar = start_process(tmp_path, "liar", [sys.executable, str(LIAR), f"127.0.0.1:{port}", "5"])
    try:
        assert server.wait(180) == 0, server.log.read_text()
        for c in [*honest, liar]:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        for p in (server, *honest, liar):
            p.kill()
    events = server.events()
    decisions = [e["decision"] for e in events if e.get("event") == "canary"]
    with RunStore.open(tmp_path / run_dir_of(server), read_only=True) as store:
        versions = vs.list_versions(store)
        assert [v.round_idx for v in versions] == [0, 1, 2]
        assert [v.metrics["canary_clients"] for v in versions[1:]] == [6.0, 6.0]
        truth = [_honest_decision(cfg, store, v) for v in versions[1:]]
    assert decisions == truth and "promote" in truth, (decisions, truth)
    refused = [e["reason"] for e in events if e.get("event") == "refused" and e["client"] == 5]
    assert refused and all(
        r == "malformed evaluation of client 5: accuracy = -1000000000.0: must be in [0, 1]"
        for r in refused
    ), refused

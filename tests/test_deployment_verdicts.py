"""A client hears the round's true word on its update, over real ``fedforge
server`` and ``fedforge client`` processes on loopback: the first round judges
its uploads by the median of their own norms only at its end, and an update
refused there is told refused, never accepted."""

from __future__ import annotations

from pathlib import Path

from deploy_procs import start_client, start_server, write_config
from fedforge.robust.attacks import attacker_ids


def test_an_update_refused_at_the_first_rounds_end_is_told_refused(tmp_path: Path) -> None:
    """One attacker among six clients, its update scaled 100 times (far inside
    the absolute bound, far past the relative one), every client in both rounds, under
    the default bound (10 x the median norm): in round 1 the updates wait for the
    round's median, in round 2 the bound is round 1's. Each process hosts three
    clients, so its updates are in flight together while the round waits."""
    robust = {"attack": "scaled", "attack_fraction": 0.17, "attack_scale": 100.0}
    cfg = write_config(tmp_path / "cfg.yaml", client_fraction=1.0, rounds=2, robust=robust)
    (bad,) = attacker_ids(6, 0.17, 0)
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
    try:
        assert server.wait(180) == 0, server.log.read_text()
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        for p in (server, *clients):
            p.kill()
    events = [e for c in clients for e in c.events()]
    said = {
        (e["client"], e["round"]): e.get("reason")
        for e in events
        if e.get("event") in ("upload_accepted", "upload_refused", "upload_unjudged")
    }
    honest = {(c, r): None for c in range(6) if c != bad for r in (1, 2)}
    assert {k: v for k, v in said.items() if k[0] != bad} == honest
    first, second = said[(bad, 1)], said[(bad, 2)]
    assert first is not None and "the median norm of this round's uploads" in first
    assert (
        second is not None and "the median norm of the updates taken in the last 1 round" in second
    )
    accepted = [e for e in events if e.get("event") == "upload_accepted" and e["client"] == bad]
    assert accepted == []

"""Selection by measured speed in a deployment: real ``fedforge server`` and
client processes on loopback running ``selection.policy: oort``, one client
slowed on purpose (``--slowdown``). The cohorts the server drew are replayed
from the run store's records (the cohorts, the taken losses, the measured
times) through Oort's own rule, so the slowed client's rarity is derived from
the policy, not assumed; then ``fedforge profile`` on the run, read back."""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from deploy_procs import run_dir_of, start_client, start_server, write_config
from fedforge import config as config_mod
from fedforge.cli import main
from fedforge.selection.history import History
from fedforge.selection.named import SelectionRound
from fedforge.selection.oort import Oort
from fedforge.selection.options import OortOptions
from fedforge.selection.sampling import cohort_rng
from fedforge.server.experiment import build
from fedforge.systems import read_profiles

CLIENTS, SLOW, SLOWDOWN, ROUNDS, COHORT = 4, 3, 20.0, 12, 2


def _rows(db: sqlite3.Connection, sql: str) -> list[tuple]:
    return db.execute(sql).fetchall()


@pytest.mark.slow
def test_oort_asks_the_slowed_client_less_and_the_profile_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four clients, two asked a round, client 3 twenty times slower. Oort
    explores the clients never heard from first (all four within the first
    rounds), then draws among those whose score is at least ``cut_off`` times
    the cohort's last: a client slower than the preferred duration T (the 30th
    percentile of the measured ones) has its utility times (T / t)^2. Replaying
    the records through the policy gives back every stored cohort, and with it
    the rounds in which the slowed client's score let it into the draw: it is
    asked no more often than those allow, and less often than every other client."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        dataset="regression",
        model="linear",
        num_clients=CLIENTS,
        client_fraction=COHORT / CLIENTS,
        rounds=ROUNDS,
        local_epochs=5,
        selection={"policy": "oort"},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [
        start_client(
            tmp_path,
            port,
            str(c),
            "--insecure",
            *(["--slowdown", str(SLOWDOWN)] if c == SLOW else []),
        )
        for c in range(CLIENTS)
    ]
    try:
        assert server.wait(240) == 0, server.log.read_text()
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        for p in (server, *clients):
            p.kill()
    run_dir = tmp_path / run_dir_of(server)
    loaded = config_mod.load(cfg)
    exp = build(loaded)
    sizes = [exp.data.num_examples(c) for c in range(CLIENTS)]
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        cohorts = _rows(db, "SELECT round_idx, client_id FROM cohorts ORDER BY 1, 2")
        losses = _rows(db, "SELECT round_idx, client_id, train_loss FROM client_rounds")
        times = _rows(db, "SELECT round_idx, client_id, total_s, arrived FROM client_times")
        refused = _rows(db, "SELECT round_idx, client_id FROM anomalies WHERE client_id >= 0")
        spells = _rows(db, "SELECT client_id, since, until, left FROM presence ORDER BY 1, 2")
        watches = _rows(db, "SELECT since, until FROM presence_watch")
    asked = {r: sorted(c for rr, c in cohorts if rr == r) for r in range(ROUNDS)}
    assert all(len(asked[r]) == COHORT for r in range(ROUNDS))

    # the replay: the selection hook's updates of the history, Oort's draw from it
    oort, history = Oort(OortOptions()), History()
    measured, admitted = None, 0
    for r in range(ROUNDS):
        ask = SelectionRound(
            r, list(range(CLIENTS)), COHORT, history.view(sizes), cohort_rng(loaded.seed, r)
        )
        assert sorted(oort.select(ask)) == asked[r], r
        scores = oort.scores(ask)
        if measured is not None and len(scores) == CLIENTS:
            kth = sorted(scores.values(), reverse=True)[COHORT - 1]
            admitted += scores[SLOW] >= OortOptions().cut_off * kth
        came = [c for rr, c, _, a in times if rr == r and a]
        history.round_done(
            r,
            r,
            asked[r],
            came,
            {c: math.nan if v is None else v for rr, c, v in losses if rr == r},
            [c for rr, c in refused if rr == r],
            {c: t for rr, c, t, a in times if rr == r and a},
        )
        if measured is None and SLOW in came:
            measured = r
    assert measured is not None  # explored, then measured
    count = Counter(c for _, c in cohorts)
    assert count[SLOW] <= 1 + (ROUNDS - 1 - measured) and count[SLOW] <= 1 + admitted
    fast_mean = sum(count[c] for c in range(CLIENTS) if c != SLOW) / (CLIENTS - 1)
    assert count[SLOW] < fast_mean and count[SLOW] < ROUNDS * COHORT / CLIENTS, count

    # who was there: every client joined before the first round and stayed to the
    # end, one spell each within the server's one watch: always online
    assert len(watches) == 1 and [s[0] for s in spells] == list(range(CLIENTS))
    assert all(
        not left and watches[0][0] <= since < until <= watches[0][1]
        for _, since, until, left in spells
    )

    out = tmp_path / "pop.csv"
    capsys.readouterr()
    assert main(["profile", str(run_dir), "--out", str(out)]) == 0
    assert "availability is not in the run's records" not in capsys.readouterr().err
    profiles = read_profiles(out, CLIENTS)
    fast = [profiles[c].samples_per_s for c in range(CLIENTS) if c != SLOW]
    assert profiles[SLOW].samples_per_s < min(fast)
    assert all(p.always_online for p in profiles)

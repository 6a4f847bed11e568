"""Availability measured in a deployment, without the network: the online
spells the hub keeps as its presence rules decide, bounded for a client that
connects and disconnects rapidly (its totals kept exact), written to the run
store across a server's restart, and the mean online and offline spells
derived from hand-made rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedforge.config import Config
from fedforge.store import RunStore
from fedforge.store.presence import read_presence
from fedforge.systems.measured_availability import availability, follow
from fedforge.transport.hub import Hub
from fedforge.transport.presence_log import PresenceLog
from fedforge.transport.spells import MAX_ROWS, Spell


def test_mean_spells_from_hand_made_rows() -> None:
    """Watches 0-100 s and 200-260 s (the server down between). Client 0: online
    0-30, 40-70, then 210-260 till the watch's end: 110 s online over 2
    departures, 10 + 30 s offline over 1 return (the downtime is no one's).
    Client 1: there throughout, always online. Client 2: one row standing for 4
    spells (3 gaps of 6 s in all merged into 0-50), gone at 50: 44 s over 4
    departures, 6 + 50 s over 3 returns. Client 4 left at 20 and never came
    back: 80 s offline seen, a lower bound. Client 3 never connected: the
    others' medians."""
    spells = [
        (0, 0.0, 30.0, 1, 0, 0.0),
        (0, 40.0, 70.0, 1, 0, 0.0),
        (0, 210.0, 260.0, 0, 0, 0.0),
        (1, 5.0, 100.0, 0, 0, 0.0),
        (2, 0.0, 50.0, 1, 3, 6.0),
        (4, 0.0, 20.0, 1, 0, 0.0),
    ]
    watches = [(0.0, 100.0), (200.0, 260.0)]
    means, notes = availability(spells, watches, 5)
    own = {0: (55.0, 40.0), 1: (math.inf, 0.0), 2: (11.0, 56 / 3), 4: (20.0, 80.0)}
    for c, want in own.items():
        assert means[c] == pytest.approx(want), c
    online = sorted(m[0] for m in own.values())  # 11, 20, 55, inf
    offline = sorted(m[1] for m in own.values())  # 0, 56/3, 40, 80
    assert means[3] == pytest.approx(((online[1] + online[2]) / 2, (offline[1] + offline[2]) / 2))
    assert notes[0].startswith("clients 4: left and never came back")
    assert notes[1].startswith("clients 3: never connected while the server watched")


def test_a_run_without_the_record_is_always_online_with_the_note() -> None:
    means, notes = availability([], None, 2)
    assert means == [(math.inf, 0.0)] * 2
    assert notes == [
        "availability is not in the run's records: every client is always online (mean_offline_s 0)"
    ]


def test_the_hub_keeps_spells_as_its_presence_rules_decide() -> None:
    """Joined at 0, heartbeats ending at 1, 2 and 3 s (1 s pauses: quiet for
    3 x 1 + 1 = 4 s it is gone): seen gone at 10, its spell ends at 7; it calls
    again at 12, a new spell, there at 15."""
    now = [0.0]
    hub = Hub(num_clients=2, heartbeat_timeout_s=30.0, clock=lambda: now[0])
    sa, _, _ = hub.join("a", [(0, 5)])
    for t in (1.0, 2.0, 3.0):
        now[0] = t
        hub.poll("a", sa, 0, True)
    now[0] = 10.0
    assert hub.alive() == []
    now[0] = 12.0
    hub.poll("a", sa, 0, True)
    now[0] = 15.0
    at, began, rows = hub.spell_rows()
    assert (at, began) == (15.0, 0.0)
    assert rows == [(0, Spell(0.0, 7.0, True)), (0, Spell(12.0, 15.0, False))]
    assert hub.spell_rows()[2] == []  # written: nothing changed since


def test_a_flapping_client_has_bounded_rows_and_exact_totals() -> None:
    """A client process joining every 10 s and going silent each time (its spell
    ends 7 s after its join: the assumed 2 s pause, 3 x 2 + 1), 1,000 times,
    written every 50 joins as the server would (a row replaced by its client and
    start): at most MAX_ROWS rows, and 7 s online per spell, 3 s offline."""
    now = [0.0]
    hub = Hub(num_clients=1, heartbeat_timeout_s=30.0, clock=lambda: now[0])
    table: dict[tuple[int, float], Spell] = {}

    def write() -> None:
        for c, s in hub.spell_rows()[2]:
            table[(c, s.since)] = s

    for k in range(1000):
        now[0] = 10.0 * k
        hub.join("a", [(0, 5)])
        now[0] = 10.0 * k + 8
        assert hub.alive() == []
        if k % 50 == 49:
            write()
    assert len(table) == MAX_ROWS
    rows = [(c, s.since, s.until, int(s.left), s.gaps, s.gap_s) for (c, _), s in table.items()]
    f = follow(rows, [(0.0, now[0])])[0]
    assert (f.departures, f.returns) == (1000, 999)
    assert f.online_s == pytest.approx(7 * 1000)
    assert f.offline_s == pytest.approx(3 * 999 + 1)  # and 9,997 to 9,998 s
    assert hub.spells.capped == {0}


def test_spells_reach_the_run_store_and_survive_a_restart(tmp_path: Path) -> None:
    """A server watching 20 s (client 1 gone after 7 s), killed; a
    second one on the same run (its clock anew) sees client 0 come back. The
    store holds both watches, the rows in seconds from the run's start (their
    lengths as the clocks measured), and the rows of the first watch kept."""
    store = RunStore.create(tmp_path, Config(name="avail"))
    try:
        now = [100.0]
        hub = Hub(num_clients=2, heartbeat_timeout_s=30.0, clock=lambda: now[0])
        log = PresenceLog(hub)
        hub.join("a", [(0, 5)])
        hub.join("b", [(1, 5)])
        log.bind(store)
        log.write()
        for t in range(104, 121, 4):  # client 0's heartbeats; client 1 quiet: gone at 107
            now[0] = float(t)
            hub.poll("a", hub.members[0].session, 0, True)
        log.write()
        first = read_presence(store)
        assert first is not None
        (w0,), rows = first[1], first[0]
        assert w0[1] - w0[0] == pytest.approx(20.0)
        assert [(c, round(u - s, 6), left) for c, s, u, left, _, _ in rows] == [
            (0, 20.0, 0),
            (1, 7.0, 1),
        ]
        now[0] = 5.0  # a new server process, its own clock
        hub2 = Hub(num_clients=2, heartbeat_timeout_s=30.0, clock=lambda: now[0])
        log2 = PresenceLog(hub2)
        log2.bind(store)
        assert hub2.spells.stored == {0: 1, 1: 1}
        hub2.join("a", [(0, 5)])
        now[0] = 9.0
        log2.write()
        spells, watches = read_presence(store) or ([], [])
        assert len(watches) == 2 and watches[1][1] - watches[1][0] == pytest.approx(4.0)
        assert [spells[0], spells[2]] == rows and spells[1][0] == 0
        assert spells[1][2] - spells[1][1] == pytest.approx(4.0)
    finally:
        store.close()

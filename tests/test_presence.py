"""Who is there, without the network: a client process whose call is closed by
its side is gone at once, one that stops calling is gone after its own
heartbeat pauses, a round samples the live clients only (and every client's
draw when all are live), waits a while for too few, and one update never
replaces the model of a larger cohort by default."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from conftest import MakeData
from fedforge.config import Config, RobustConfig, override
from fedforge.robust.attacks import attacker_ids
from fedforge.selection.sampling import sample_cohort
from fedforge.server.experiment import build
from fedforge.server.loop import run
from fedforge.transport.hub import Hub
from fedforge.transport.ids import format_ids, parse_ids
from fedforge.transport.joins import progress_line
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.remote import RemoteEngine
from fedforge.transport.work import UPDATE


class Call:
    """A gRPC call as the hub sees it: its callbacks run when it ends."""

    def __init__(self, remaining: float | None = 10.0) -> None:
        self.callbacks: list[Callable[[], None]] = []
        self.remaining = remaining

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self.callbacks.append(callback)
        return True

    def time_remaining(self) -> float | None:
        return self.remaining

    def end(self) -> None:
        for cb in self.callbacks:
            cb()


def _poll_in_thread(hub: Hub, session: str, call: Call, heartbeat: bool) -> threading.Thread:
    t = threading.Thread(target=hub.poll, args=("a", session, 10.0, heartbeat, call))
    t.start()
    return t


@pytest.mark.parametrize("heartbeat", [True, False])
def test_a_call_closed_by_the_client_is_its_process_gone_at_once(heartbeat: bool) -> None:
    """The long poll of an idle process, or the heartbeat held open while it
    works: closed from the client's side (the process died), its clients leave
    the live set and the round stops waiting for their answers, long before the
    30 s heartbeat timeout."""
    hub = Hub(num_clients=4, heartbeat_timeout_s=30.0)
    sa, _, _ = hub.join("a", [(0, 5), (1, 5)])
    hub.join("b", [(2, 5)])
    hub.ask([pb.Work(kind=pb.Work.TRAIN, client_id=c, round_idx=0) for c in (0, 1)], 0)
    if heartbeat:  # the work is handed out: the process trains, its heartbeat is held
        assert len(hub.poll("a", sa, 0, False)) == 2
    else:  # an idle process's long poll, before any work
        hub.close({(c, 0, UPDATE, "") for c in (0, 1)})
    call = Call()
    t = _poll_in_thread(hub, sa, call, heartbeat)
    time.sleep(0.3)
    assert t.is_alive()  # held open
    assert hub.alive() == [0, 1, 2]
    took = time.monotonic()
    call.end()  # the connection closed under it
    t.join(2.0)
    assert not t.is_alive() and time.monotonic() - took < 1.0
    assert hub.alive() == [2]
    if heartbeat:
        keys = {(c, 0, UPDATE, "") for c in (0, 1)}
        took = time.monotonic()
        assert list(hub.gather(keys, deadline_s=30.0)) == []
        assert time.monotonic() - took < 1.0 and hub.dropouts == 2
    hub.poll("a", sa, 0, True)  # it calls again: it is back
    assert hub.alive() == [0, 1, 2]


def test_a_call_that_ended_normally_leaves_its_process_live() -> None:
    hub = Hub(num_clients=2, heartbeat_timeout_s=30.0)
    sa, _, _ = hub.join("a", [(0, 5)])
    call = Call(remaining=1.2)  # a heartbeat held 0.2 s: 1 s before its deadline
    took = time.monotonic()
    assert hub.poll("a", sa, 0, True, call) == []
    assert 0.15 < time.monotonic() - took < 1.0
    call.end()  # gRPC's callback after the answer went out
    assert hub.alive() == [0]


def test_a_process_that_stops_calling_is_gone_after_its_own_pauses() -> None:
    """Heartbeats 1 s apart (each ending when the next pause begins): quiet for
    more than 3 x 1 + 1 = 4 s it is gone, well inside the 30 s timeout; before it
    showed a pause, its pause is taken to be 2 s (3 x 2 + 1 = 7 s)."""
    now = [0.0]
    hub = Hub(num_clients=2, heartbeat_timeout_s=30.0, clock=lambda: now[0])
    sa, _, _ = hub.join("a", [(0, 5)])
    hub.poll("a", sa, 0, True)
    now[0] = 6.9
    assert hub.alive() == [0]  # no pause seen yet
    now[0] = 7.1
    assert hub.alive() == []
    now[0] = 0.0
    sb, _, _ = hub.join("a", [(0, 5)])  # a new session, a fresh start
    hub.poll("a", sb, 0, True)
    for t in (1.0, 2.0, 3.0):
        now[0] = t
        hub.poll("a", sb, 0, True)
    now[0] = 3.0 + 3.9
    assert hub.alive() == [0]
    now[0] = 3.0 + 4.1
    assert hub.alive() == []
    hub.poll("a", sb, 0, True)
    assert hub.alive() == [0]


def test_sampling_among_every_client_is_the_simulators_draw() -> None:
    for seed in range(5):
        for r in range(4):
            for poisson in (False, True):
                plain = sample_cohort(20, 0.3, seed, r, poisson)
                assert sample_cohort(20, 0.3, seed, r, poisson, list(range(20))) == plain
    live = [1, 4, 5, 9, 12, 13]
    got = sample_cohort(20, 0.3, 0, 2, among=live)
    assert len(got) == 6 and set(got) == set(live)  # fewer live than C N = 6: every one
    got = sample_cohort(20, 0.1, 0, 2, among=live)
    assert len(got) == 2 and set(got) <= set(live)


def _engine(hub: Hub, **deployment: object) -> RemoteEngine:
    cfg = override(Config(num_clients=4, client_fraction=1.0), {"deployment": deployment})
    return RemoteEngine(hub, cfg)


def test_a_round_short_of_live_clients_waits_for_them_a_bounded_time() -> None:
    hub = Hub(num_clients=4, heartbeat_timeout_s=30.0)
    hub.join("a", [(0, 5)])
    engine = _engine(hub, live_wait_s=20.0)
    later = threading.Timer(0.5, lambda: hub.join("b", [(2, 5), (3, 5)]))
    later.start()
    took = time.monotonic()
    assert engine.sampling_pool(0, 2) == [0, 2, 3]
    assert 0.4 < time.monotonic() - took < 5.0
    engine = _engine(Hub(num_clients=4, heartbeat_timeout_s=30.0), live_wait_s=0.3)
    took = time.monotonic()
    assert engine.sampling_pool(0, 2) == []  # nobody came: the round is skipped
    assert 0.25 < time.monotonic() - took < 2.0


def test_one_update_never_replaces_the_model_of_a_larger_cohort_by_default(
    make_data: MakeData, tmp_path: Path
) -> None:
    """Two of three clients send NaN: the one honest update is not applied unless
    robust.min_clients says 1; a cohort of one client applies its update."""
    data = make_data([4, 6, 5])
    cfg = Config(
        model="2nn",
        engine="serial",
        num_clients=3,
        client_fraction=1.0,
        batch_size=None,
        rounds=2,
        target_accuracy=None,
        dtype="float64",
        checkpoint_every=0,
        runs_dir=str(tmp_path),
        robust=RobustConfig(attack="nan_inf", attack_fraction=2 / 3),
    )
    assert len(attacker_ids(3, 2 / 3, cfg.seed)) == 2
    start = build(cfg, data).initial_params
    result = run(cfg, data=data, progress=False)
    assert torch.equal(result.params, start)
    assert [why for _, why in result.skipped] == [
        "only 1 accepted update(s), fewer than min_clients = 2"
    ] * 2
    one = run(override(cfg, {"robust.min_clients": 1}), data=data, progress=False)
    assert one.skipped == [] and not torch.equal(one.params, start)
    solo = override(dataclasses.replace(cfg, robust=RobustConfig()), {"client_fraction": 1 / 3})
    alone = run(solo, data=data, progress=False)
    assert alone.skipped == [] and not torch.equal(alone.params, start)


@pytest.mark.parametrize(
    "ids", [[], [3], [0, 1, 2, 3], [0, 2, 3, 4, 9, 10, 11], list(range(0, 10000, 2))[:7]]
)
def test_ids_are_written_as_ranges_that_read_back(ids: list[int]) -> None:
    text = format_ids(ids)
    assert (parse_ids(text) if text else []) == ids


def test_the_join_line_names_the_ids_awaited_as_ranges() -> None:
    line = progress_line(list(range(25)), 100, 100, "10:42")
    assert line == "25 of 100 joined; waiting for ids 25-99 until 10:42"
    line = progress_line([*range(10), 5000], 10000, 50, "09:05")
    assert (
        line
        == "11 of 10000 joined (50 needed to start); waiting for ids 10-4999,5001-9999 until 09:05"
    )

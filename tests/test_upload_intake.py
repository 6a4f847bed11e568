"""The server's intake of uploads, against a hostile client: a lying example
count, duplicate and foreign uploads, an absurd update. Each case is compared
with the same round run honestly (an independent run, not a stored number)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
from tests.conftest import TINY_LOGREG, MakeData

import fedforge
from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config import from_dict
from fedforge.core import wire
from fedforge.engines import SimulationEngine
from fedforge.report.progress import Progress
from fedforge.robust.attacks import attacker_ids
from fedforge.server.experiment import build
from fedforge.server.hooks import RoundHook, RoundInfo
from fedforge.server.registry import Registry
from fedforge.server.round import run_round
from fedforge.server.state import LoopState

Rewrite = Callable[[list[ClientUpload]], list[ClientUpload]]
SIZES = [30, 20, 40, 30, 25, 35, 30, 30, 20, 40]


class _Hostile(SimulationEngine):
    """An engine whose cohort's uploads pass through ``rewrite`` first."""

    def __init__(self, inner: Any, rewrite: Rewrite) -> None:
        self.inner, self.rewrite, self.name = inner, rewrite, inner.name

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        yield from self.rewrite(list(self.inner.run_cohort(tasks, payload)))

    def run_phase(self, phase: str, messages: Any) -> dict[int, bytes]:
        return self.inner.run_phase(phase, messages)


def _round(data: Any, rewrite: Rewrite | None = None, **robust: Any) -> LoopState:
    cfg = from_dict({**TINY_LOGREG, "num_clients": len(SIZES), "robust": robust})
    exp = build(cfg, data)
    if rewrite is not None:
        exp.engine = _Hostile(exp.engine, rewrite)
    state = LoopState.fresh(exp)
    run_round(exp, state, 0, Progress(1, "t", enabled=False))
    return state


def _header(up: ClientUpload, **meta: Any) -> ClientUpload:
    msg = wire.decode(up.data)
    return ClientUpload(up.client_id, wire.encode(msg.tensors, {**msg.meta, **meta}), up.seconds)


def _lie(ups: list[ClientUpload]) -> list[ClientUpload]:
    return [_header(u, num_examples=10**12) if u.client_id == 3 else u for u in ups]


@pytest.mark.parametrize("aggregator", ["mean", "norm_bound"])
def test_a_lying_example_count_weighs_what_the_client_declared(
    make_data: MakeData, aggregator: str
) -> None:
    """10^12 claimed examples (the client holds 30): the round's model equals the
    honest round's, on the streaming mean and on norm bounding (which keeps
    count weights). Unbounded, the lie would have made the liar's update the
    global one: the round with the liar alone is far from the honest round."""
    data = make_data(SIZES, seed=1)
    honest = _round(data, aggregator=aggregator, norm_bound=1.0)
    lied = _round(data, _lie, aggregator=aggregator, norm_bound=1.0)
    assert torch.allclose(lied.params, honest.params, rtol=0, atol=1e-12)

    def liar_alone(ups: list[ClientUpload]) -> list[ClientUpload]:
        return [u for u in ups if u.client_id == 3]

    alone = _round(data, liar_alone, aggregator=aggregator, norm_bound=1.0)
    assert (alone.params - honest.params).norm() > 100 * (lied.params - honest.params).norm()
    assert (alone.params - honest.params).norm() > 1e-3


def test_a_count_lied_at_join_weighs_at_most_the_ratio_of_the_median() -> None:
    """A declaration of 10^12 among nine of 30: capped at 10 x 30 (the median)."""
    reg = Registry([30] * 9 + [10**12], 10.0)
    assert reg.weight(9, 10**12) == 300.0
    assert reg.weight(0, 30) == 30.0 and reg.weight(0, 10**12) == 30.0
    assert Registry([30] * 9 + [10**12], None).weight(9, 10**12) == 10**12


@pytest.mark.parametrize("aggregator", ["mean", "median"])
def test_duplicate_and_foreign_uploads_are_refused_with_a_reason(
    make_data: MakeData, aggregator: str
) -> None:
    """A second upload from client 2 and one from client 77 (outside the
    federation): both refused, the model as in the honest round (under median
    the round used to crash on the extra row)."""
    data = make_data(SIZES, seed=2)

    def extra(ups: list[ClientUpload]) -> list[ClientUpload]:
        two = next(u for u in ups if u.client_id == 2)
        return [*ups, two, ClientUpload(77, two.data, 0.0)]

    honest = _round(data, aggregator=aggregator)
    state = _round(data, extra, aggregator=aggregator)
    assert torch.equal(state.params, honest.params)
    reasons = {client: why for _, client, why in state.rejected}
    assert "already sent an update in round 1" in reasons[2]
    assert "was not asked to train in round 1" in reasons[77]


def test_an_absurd_update_is_refused_by_default(make_data: MakeData) -> None:
    """A delta of 1e30 per coordinate: refused by the default bound (the model
    stays finite and equals the round without that client), and by the bound
    relative to the others' norms alone; with both bounds off it is averaged in
    and the model leaves any sane range."""
    data = make_data(SIZES, seed=3)

    def huge(ups: list[ClientUpload]) -> list[ClientUpload]:
        out = []
        for u in ups:
            if u.client_id == 5:
                msg = wire.decode(u.data)
                delta = torch.full_like(msg.tensors["delta"], 1e30)
                u = ClientUpload(5, wire.encode({"delta": delta}, msg.meta), u.seconds)
            out.append(u)
        return out

    def without_5(ups: list[ClientUpload]) -> list[ClientUpload]:
        return [u for u in ups if u.client_id != 5]

    state = _round(data, huge)
    assert any(c == 5 and "passes the bound" in why for _, c, why in state.rejected)
    assert torch.equal(state.params, _round(data, without_5).params)
    relative = _round(data, huge, max_update_ratio=None)
    assert any(c == 5 and "max_norm_multiple" in why for _, c, why in relative.rejected)
    assert torch.equal(relative.params, _round(data, without_5).params)
    off = _round(data, huge, max_update_ratio=None, max_norm_multiple=None)
    assert float(off.params.abs().max()) > 1e20


@pytest.mark.parametrize(
    "changes",
    [{}, {"robust": {"aggregator": "median"}}, {"communication": {"groups": 2}}],
    ids=["streaming", "gathered", "hierarchical"],
)
def test_a_first_round_holds_its_uploads_and_refuses_past_its_median(
    make_data: MakeData, changes: dict[str, Any]
) -> None:
    """A round with no norms behind it judges its uploads by their own median
    before any reaches the aggregate, in each collector: client 5's update
    scaled 10^3 is refused (10 x the median is far below it) and the round
    equals the round without client 5; the taken norms are remembered."""
    data = make_data(SIZES, seed=7)

    def scaled(ups: list[ClientUpload]) -> list[ClientUpload]:
        out = []
        for u in ups:
            if u.client_id == 5:
                msg = wire.decode(u.data)
                delta = msg.tensors["delta"] * 1e3
                u = ClientUpload(5, wire.encode({**msg.tensors, "delta": delta}, msg.meta), 0.0)
            out.append(u)
        return out

    def one_round(rewrite: Rewrite) -> LoopState:
        cfg = from_dict({**TINY_LOGREG, "num_clients": len(SIZES), **changes})
        exp = build(cfg, data)
        exp.engine = _Hostile(exp.engine, rewrite)
        state = LoopState.fresh(exp)
        run_round(exp, state, 0, Progress(1, "t", enabled=False))
        return state

    state = one_round(scaled)
    without = one_round(lambda ups: [u for u in ups if u.client_id != 5])
    assert [(c, "this round's uploads" in why) for _, c, why in state.rejected] == [(5, True)]
    assert torch.equal(state.params, without.params)
    assert state.update_norms == without.update_norms and len(state.update_norms[0]) == 9


@pytest.mark.parametrize("aggregator", ["mean", "median"])
def test_uploads_in_any_order_give_the_same_round(make_data: MakeData, aggregator: str) -> None:
    """The collector takes uploads as they come: reversed, the round's model is the
    same (to float64 rounding of the running sum; exactly for the median)."""
    data = make_data(SIZES, seed=4)
    forward = _round(data, aggregator=aggregator)
    backward = _round(data, lambda ups: ups[::-1], aggregator=aggregator)
    assert torch.allclose(backward.params, forward.params, rtol=0, atol=1e-14)


def test_a_client_that_drops_gets_no_payload_and_is_not_waited_for(make_data: MakeData) -> None:
    """A collector told of a dropout before the upload phase hands the payload to
    the others only, and its bytes down count them alone."""
    from fedforge.server.cohort import sample
    from fedforge.server.collect import collect
    from fedforge.server.collectors.base import RoundLog
    from fedforge.server.round import collector_for, configure

    cfg = from_dict({**TINY_LOGREG, "num_clients": len(SIZES)})
    exp = build(cfg, make_data(SIZES, seed=5))
    state = LoopState.fresh(exp)
    log = RoundLog(state.rejected, state.skipped, Progress(1, "t", enabled=False), 0)
    orders = configure(exp, state, 0, 0, sample(exp, 0))
    collector = collector_for(exp, orders, log, None)
    collector.dropout(4)
    got = collect(exp, collector, orders.tasks, orders.payload, 0)
    assert sorted(got.clients) == [c for c in range(10) if c != 4]
    assert got.bytes_down == 9 * len(orders.payload)


def test_a_huge_control_delta_is_refused_like_a_huge_update(make_data: MakeData) -> None:
    """SCAFFOLD's delta c_k reaches every client through c: the same norm bound
    refuses one of 1e30 a coordinate, and c stays finite."""

    def huge_control(ups: list[ClientUpload]) -> list[ClientUpload]:
        out = []
        for u in ups:
            if u.client_id == 2:
                msg = wire.decode(u.data)
                tensors = dict(msg.tensors)
                for k in [k for k in tensors if "control" in k]:
                    tensors[k] = torch.full_like(tensors[k], 1e30)
                u = ClientUpload(2, wire.encode(tensors, msg.meta), u.seconds)
            out.append(u)
        return out

    data = make_data(SIZES, seed=6)
    cfg = from_dict({**TINY_LOGREG, "num_clients": len(SIZES), "algorithm": "scaffold"})
    exp = build(cfg, data)
    exp.engine = _Hostile(exp.engine, huge_control)
    state = LoopState.fresh(exp)
    run_round(exp, state, 0, Progress(1, "t", enabled=False))
    refused = [why for _, c, why in state.rejected if c == 2]
    assert refused and "'control_delta' norm" in refused[0], refused
    assert "passes the bound" in refused[0]
    assert all(bool(torch.isfinite(t).all()) for t in state.algorithm_state.values())


def test_late_and_out_of_turn_messages_are_refused() -> None:
    """A collector fed by hand, as a server is from the network: an upload after
    its phase closed, or from a client reported gone, is refused with a reason
    and never reaches the aggregate."""
    from fedforge.server.cohort import sample
    from fedforge.server.collectors.base import RoundLog
    from fedforge.server.round import collector_for, configure

    data = _data_for_hand()
    exp = build(from_dict({**TINY_LOGREG, "num_clients": len(SIZES)}), data)
    state = LoopState.fresh(exp)
    log = RoundLog(state.rejected, state.skipped, Progress(1, "t", enabled=False), 0)
    orders = configure(exp, state, 0, 0, sample(exp, 0))
    collector = collector_for(exp, orders, log, None)
    phase = collector.next_phase()
    assert phase is not None and len(phase.train) == 10
    ups = {u.client_id: u for u in exp.engine.run_cohort(orders.tasks, orders.payload)}
    for c in (0, 1, 2):
        assert collector.offer(c, ups[c].data) is None
    collector.dropout(3)
    assert "reported gone" in (collector.offer(3, ups[3].data) or "")
    collector.end_phase()
    assert "upload phase is over" in (collector.offer(4, ups[4].data) or "")
    assert sorted(collector.finish().clients) == [0, 1, 2]


def _data_for_hand() -> Any:
    from tests.conftest import _make_data

    return _make_data(SIZES, seed=7)


def test_an_update_that_weighs_nothing_is_refused_not_a_crash(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose declared count is 0 (a deployment client that declared none,
    or joined after the round's limits were set) would add nothing to the weighted
    mean; alone in its round it made the mean 0/0 and the server crashed. It is
    refused with the reason, and a round of it alone is skipped."""
    from fedforge.server.experiment import Experiment

    data = make_data(SIZES, seed=1)
    declared = [0 if c == 3 else n for c, n in enumerate(SIZES)]
    monkeypatch.setattr(Experiment, "client_sizes", lambda self: declared)
    state = _round(data)
    assert [(c, why) for _, c, why in state.rejected] == [
        (3, "client 3's update weighs nothing: it reports 30 examples and may claim at most 0")
    ]
    honest = _round(data, lambda ups: [u for u in ups if u.client_id != 3])
    assert torch.equal(state.params, honest.params)  # as if client 3 had not answered
    alone = _round(data, lambda ups: [u for u in ups if u.client_id == 3])
    assert [r for r, _ in alone.skipped] == [0]
    start = build(from_dict({**TINY_LOGREG, "num_clients": len(SIZES)}), data).initial_params
    assert torch.equal(alone.params, start)


@pytest.mark.parametrize("policy", ["uniform", "power_of_choice", "oort"])
def test_refused_clients_asked_again_cannot_raise_the_bound(
    make_data: MakeData, policy: str
) -> None:
    """Six of twenty clients scale their updates 10^3. Only taken norms set the
    bound, so each of their uploads is refused whenever they are asked (round
    after round under uniform selection), and the model stays where honest
    rounds put it (its norm within a few times the honest run's).
    power_of_choice asks first the clients whose loss it does not know; a
    refused client's loss is never known, so it ranks them last once refused:
    each attacker is asked at most twice (its first draw, and a round whose
    candidates hold too few others). oort explores a client never taken until
    it has been refused twice (explore_refusals), then no more: at most twice."""
    data = make_data([20] * 20, seed=1)
    base = {**TINY_LOGREG, "num_clients": 20, "client_fraction": 0.25, "rounds": 10}
    attack = {"attack": "scaled", "attack_fraction": 0.3, "attack_scale": 1e3}
    cfg = from_dict({**base, "selection": {"policy": policy}, "robust": attack})
    bad = set(attacker_ids(20, 0.3, cfg.seed))
    uploads = _Uploads()
    result = fedforge.run(cfg, data=data, progress=False, store=False, hooks=[uploads])
    honest = fedforge.run(from_dict(base), data=data, progress=False, store=False)
    asked = [(r, c) for r, c, _ in uploads.seen if c in bad]
    if policy == "uniform":
        assert len(asked) >= 10  # asked again and again
    else:
        times = [sum(c == a for _, c in asked) for a in bad]
        assert asked and max(times) <= 2, times
    assert all(not taken for r, c, taken in uploads.seen if c in bad)
    assert {(r, c) for r, c, _ in result.rejected if c in bad} == set(asked)
    assert float(result.params.norm()) < 5 * float(honest.params.norm())


class _Uploads(RoundHook):
    """Every upload's verdict: (round, client, taken)."""

    name = "uploads"

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, bool]] = []

    def upload(self, info: RoundInfo, client_id: int, taken: bool, reason: str | None) -> None:
        self.seen.append((info.round_idx, client_id, taken))

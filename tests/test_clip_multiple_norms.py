"""``communication.clip_multiple`` follows the clients' own update norms, those
before their clip: over rounds whose true norms grow, each round's bound is the
multiple x the upper-middle median of the previous rounds' true norms, computed
here from the same tasks run without the clip (a multiple below 1 included,
which clips most clients every round). A client's reported norm is checked
(finite, >= 0) and one client's far-off report does not move the bound past the
others' norms."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
import torch
from tests.conftest import TINY_LOGREG, MakeData

from fedforge.client.runtime import NORM_BEFORE_CLIP, ClientTask, ClientUpload
from fedforge.config import from_dict
from fedforge.core import registry, wire
from fedforge.core.errors import UploadError
from fedforge.engines import SimulationEngine
from fedforge.report.progress import Progress
from fedforge.server.client_lr import LrRound, register_lr_rule
from fedforge.server.collectors.base import RoundLog
from fedforge.server.experiment import build
from fedforge.server.round import collector_for, configure, run_round
from fedforge.server.state import LoopState
from fedforge.server.update_header import read_norm_before_clip

SIZES = [12, 30, 18, 24, 9]
GROWTH = 2.0  # each round's lr x this: the update norms grow 3-4x over the run
ROUNDS = 4


class _Growing:
    """Every client's lr x GROWTH^round: the true norms grow round by round."""

    def scales(self, round: LrRound) -> Mapping[int, float]:
        return {c: GROWTH**round.round_idx for c in round.cohort}


@pytest.fixture
def growing() -> Iterator[str]:
    register_lr_rule("test_growing", lambda context: _Growing(), replace=True)
    yield "test_growing"
    registry.unregister("lr_rule", "test_growing")


def _delta(data: bytes) -> torch.Tensor:
    return wire.decode(data).tensors["delta"]


class _TrueNorms(SimulationEngine):
    """The inner engine; each round's tasks, its uploads, and the same tasks run
    again without the clip (``true``: each client's delta as it trained it).
    ``lie``: a client whose header reports this norm in place of its own."""

    def __init__(self, inner: Any, lie: tuple[int, float] | None = None) -> None:
        self.inner, self.name, self.lie = inner, inner.name, lie
        self.tasks: list[list[ClientTask]] = []
        self.uploads: list[dict[int, bytes]] = []
        self.true: list[dict[int, torch.Tensor]] = []

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        self.tasks.append(list(tasks))
        free = [
            dataclasses.replace(
                t, plan=dataclasses.replace(t.plan, upload_clip=None, report_norm=False)
            )
            for t in tasks
        ]
        self.true.append(
            {u.client_id: _delta(u.data) for u in self.inner.run_cohort(free, payload)}
        )
        ups = list(self.inner.run_cohort(tasks, payload))
        self.uploads.append({u.client_id: u.data for u in ups})
        for u in ups:
            if self.lie is not None and u.client_id == self.lie[0]:
                msg = wire.decode(u.data)
                meta = {**msg.meta, NORM_BEFORE_CLIP: self.lie[1]}
                u = dataclasses.replace(u, data=wire.encode(msg.tensors, meta))
            yield u

    def run_phase(self, phase: str, messages: Any) -> dict[int, bytes]:
        return self.inner.run_phase(phase, messages)


def _upper_median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _run(
    make_data: MakeData,
    rule: str,
    multiple: float,
    window: int,
    engine: str = "serial",
    lie: tuple[int, float] | None = None,
) -> tuple[LoopState, _TrueNorms]:
    cfg = from_dict(
        {
            **TINY_LOGREG,
            "num_clients": len(SIZES),
            "batch_size": None,  # full-batch steps: the norms grow with the lr
            "lr": 0.02,
            "local_epochs": 2,
            "rounds": ROUNDS,
            "engine": engine,
            "local": {"lr_rule": rule},
            "communication": {"clip_multiple": multiple},
            "robust": {"norm_window": window},
        }
    )
    exp = build(cfg, make_data(SIZES, seed=7))
    exp.engine = rec = _TrueNorms(exp.engine, lie)
    state = LoopState.fresh(exp)
    for r in range(ROUNDS):
        run_round(exp, state, r, Progress(ROUNDS, "t", enabled=False))
    return state, rec


@pytest.mark.parametrize(
    ("multiple", "window", "engine"),
    [
        (0.5, 1, "serial"),
        (1.0, 1, "serial"),
        (2.0, 1, "serial"),
        (0.5, 2, "serial"),
        (0.5, 1, "vectorized"),
    ],
)
def test_the_bound_follows_the_median_of_the_true_norms(
    make_data: MakeData, growing: str, multiple: float, window: int, engine: str
) -> None:
    """Round 1 sends no bound. Round r's bound is ``multiple`` x the upper middle
    of the true norms of the ``window`` rounds before it, computed here from the
    tasks run without the clip; each upload is its true delta x min(1, bound /
    its norm). The true norms grow 3-4x over the run, and so does the bound."""
    state, rec = _run(make_data, growing, multiple, window, engine)
    assert state.rejected == []
    true_norms = [{c: float(d.norm()) for c, d in r.items()} for r in rec.true]
    first, last = (_upper_median(list(n.values())) for n in (true_norms[0], true_norms[-1]))
    assert last > 2.5 * first  # the premise: the clients' steps grow
    assert all(t.plan.upload_clip is None for t in rec.tasks[0])
    bounds = []
    for r in range(1, ROUNDS):
        behind = [n for norms in true_norms[max(0, r - window) : r] for n in norms.values()]
        bound = multiple * _upper_median(behind)
        bounds.append(bound)
        got = [t.plan.upload_clip for t in rec.tasks[r]]
        assert got == pytest.approx([bound] * len(SIZES), rel=1e-9), r
        for c, data in rec.uploads[r].items():
            true = rec.true[r][c]
            want = true * min(1.0, bound / float(true.norm()))
            assert torch.allclose(_delta(data), want, rtol=0, atol=1e-12), (r, c)
    assert bounds == sorted(bounds) and bounds[-1] > 1.5 * bounds[0]  # it keeps up
    if multiple < 1:  # most clients are clipped every round after the first
        clipped = sum(n > bounds[-1] for n in true_norms[-1].values())
        assert clipped > len(SIZES) / 2
    want_recent = [[n[c] for c in sorted(n)] for n in true_norms[-window:]]
    assert state.clip_norms == [pytest.approx(r, rel=1e-12) for r in want_recent]
    assert state.checkpoint(0.0).loop["clip_norms"] == state.clip_norms


def test_one_client_far_off_report_moves_the_bound_no_further_than_the_others(
    make_data: MakeData, growing: str
) -> None:
    """Client 0 reports a norm of 1e30 every round: its update is taken, and each
    bound stays the multiple of a median among the honest clients' true norms."""
    state, rec = _run(make_data, growing, 0.5, 1, lie=(0, 1e30))
    assert state.rejected == []
    for r in range(1, ROUNDS):
        honest = [n for c, d in rec.true[r - 1].items() if c != 0 for n in [float(d.norm())]]
        bound = rec.tasks[r][0].plan.upload_clip
        assert bound is not None and min(honest) <= bound / 0.5 <= max(honest)
        reported = {**{c: float(d.norm()) for c, d in rec.true[r - 1].items()}, 0: 1e30}
        assert bound == pytest.approx(0.5 * _upper_median(list(reported.values())), rel=1e-9)


@pytest.mark.parametrize("tiny", [0.0, 1e-300])
def test_one_client_reporting_next_to_nothing_does_not_pull_the_bound_down(
    make_data: MakeData, growing: str, tiny: float
) -> None:
    """Client 0 reports 0 (or 1e-300) every round: the bound stays the multiple of
    an honest client's true norm (the upper median), so it neither switches the
    clip off nor clips the others' updates towards nothing."""
    state, rec = _run(make_data, growing, 1.0, 1, lie=(0, tiny))
    for r in range(1, ROUNDS):
        honest = [float(d.norm()) for c, d in rec.true[r - 1].items() if c != 0]
        bound = rec.tasks[r][0].plan.upload_clip
        assert bound is not None and min(honest) <= bound <= max(honest)


@pytest.mark.parametrize(
    ("value", "want"),
    [(None, None), (0, 0.0), (2.5, 2.5), (7, 7.0), (10**400, "finite"), (-1.0, "finite")],
)
def test_a_reported_norm_is_a_finite_non_negative_number(value: Any, want: Any) -> None:
    meta = {} if value is None else {NORM_BEFORE_CLIP: value}
    if isinstance(want, str):
        with pytest.raises(UploadError, match=f"{NORM_BEFORE_CLIP} .* must be a finite number"):
            read_norm_before_clip(meta)
    else:
        assert read_norm_before_clip(meta) == want


@pytest.mark.parametrize("bad", [True, "3", [1.0], {"x": 1}])
def test_a_reported_norm_that_is_no_number_is_refused(bad: Any) -> None:
    with pytest.raises(UploadError, match="must be a finite number >= 0"):
        read_norm_before_clip({NORM_BEFORE_CLIP: bad})


def test_an_update_whose_report_is_refused_is_not_taken(make_data: MakeData, growing: str) -> None:
    """A negative report refuses client 0's update, with the reason, each round."""
    state, _ = _run(make_data, growing, 0.5, 1, lie=(0, -1.0))
    refused = [(r, c) for r, c, _ in state.rejected]
    assert refused == [(r, 0) for r in range(ROUNDS)]
    assert all(math.isfinite(float(x)) for x in state.params)
    assert "norm_before_clip -1.0 must be a finite number >= 0" in state.rejected[0][2]


def test_workers_summing_uploads_pass_on_the_reported_norms(make_data: MakeData) -> None:
    """The uploads judged and summed where they trained (``engine: ray``'s
    workers, partial.py) carry each client's reported norm to the round's
    collection, as the driver's intake does: the norms before the clip beside
    the clipped norms as decoded."""
    cfg = from_dict(
        {
            **TINY_LOGREG,
            "num_clients": len(SIZES),
            "communication": {"clip_multiple": 0.5},
            "robust": {"max_norm_multiple": None},  # a round that does not wait
        }
    )
    exp = build(cfg, make_data(SIZES, seed=7))
    state = LoopState.fresh(exp)
    run_round(exp, state, 0, Progress(2, "t", enabled=False))
    orders = configure(exp, state, 1, 1, list(range(len(SIZES))))
    bound = orders.tasks[0].plan.upload_clip
    assert bound is not None
    log = RoundLog(state.rejected, state.skipped, Progress(2, "t", enabled=False), 1)
    collector = collector_for(exp, orders, log, None)
    summing = collector.summing()
    assert summing is not None  # the premise: this round may be summed on workers
    share = summing.start(exp.pipeline.codec)
    reported = {}
    for up in exp.engine.run_cohort(orders.tasks, orders.payload):
        share.add(up.client_id, up.data, 0.0)
        reported[up.client_id] = wire.decode(up.data).meta[NORM_BEFORE_CLIP]
    assert collector.take_share(share) == sorted(reported)
    collected = collector.finish()
    assert collected.clip_norms == reported
    assert max(reported.values()) > bound >= max(collected.norms.values()) - 1e-12

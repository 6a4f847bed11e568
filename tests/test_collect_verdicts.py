"""Each uploader is told the round's final word on its update (``collect.py``):
a round that judges its uploads together (the first round's bound by their own
median norm, a cohort stage such as the norm gate) tells them at its end, and
an upload it refuses there is never first told taken."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from tests.conftest import TINY_LOGREG, MakeData

from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config import from_dict
from fedforge.engines import SimulationEngine
from fedforge.report.progress import Progress
from fedforge.robust.attacks import attacker_ids
from fedforge.server.experiment import build
from fedforge.server.round import run_round
from fedforge.server.state import LoopState

SIZES = [30, 20, 40, 30, 25, 35, 30, 30, 20, 40]


class _Told(SimulationEngine):
    """An engine whose uploads carry a ``settle`` that writes down every word said,
    and whether the cohort had all arrived when it was said."""

    last: _Told  # the newest one (a round that raised)

    def __init__(self, inner: Any, stop_after: int | None = None) -> None:
        self.inner, self.name, self.stop_after = inner, inner.name, stop_after
        self.words: dict[int, list[tuple[str | None, bool]]] = {}
        self.all_in = False

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        for n, up in enumerate(self.inner.run_cohort(tasks, payload)):
            if n == self.stop_after:
                raise KeyboardInterrupt  # the server stopped mid-round
            words = self.words.setdefault(up.client_id, [])
            yield ClientUpload(
                up.client_id, up.data, up.seconds, lambda w, ws=words: ws.append((w, self.all_in))
            )
        self.all_in = True

    def run_phase(self, phase: str, messages: Any) -> dict[int, bytes]:
        return self.inner.run_phase(phase, messages)


def _told(data: Any, stop_after: int | None = None, **robust: Any) -> _Told:
    """Round 1 of ten clients on ``data`` with ``robust``: the words its uploaders
    were told (a round stopped mid-way: raised, its words in ``_Told.last``)."""
    cfg = from_dict({**TINY_LOGREG, "num_clients": len(SIZES), "robust": robust})
    exp = build(cfg, data)
    engine = _Told.last = _Told(exp.engine, stop_after)
    exp.engine = engine
    run_round(exp, LoopState.fresh(exp), 0, Progress(1, "t", enabled=False))
    return engine


@pytest.mark.parametrize(
    "robust,why",
    [
        ({}, "the median norm of this round's uploads"),  # the first round's own median
        ({"max_norm_multiple": None, "norm_gate": 3.5}, "norm_gate"),  # a cohort stage
    ],
)
def test_an_update_refused_at_the_rounds_end_is_told_so_once(
    make_data: MakeData, robust: dict[str, Any], why: str
) -> None:
    attack = {"attack": "scaled", "attack_fraction": 0.1, "attack_scale": 50.0}
    engine = _told(make_data(SIZES, seed=1), **attack, **robust)
    (bad,) = attacker_ids(len(SIZES), 0.1, 0)
    assert set(engine.words) == set(range(len(SIZES)))
    for c, words in engine.words.items():
        assert len(words) == 1 and words[0][1], (c, words)  # one word, at the round's end
        reason = words[0][0]
        assert (reason is not None and why in reason) if c == bad else reason is None


def test_a_round_that_stops_tells_its_held_uploads_it_did_not_judge(make_data: MakeData) -> None:
    with pytest.raises(KeyboardInterrupt):
        _told(make_data(SIZES, seed=1), stop_after=3)
    assert _Told.last.words == {
        c: [(f"round 1 stopped before it judged client {c}'s update", False)]
        for c in _Told.last.words
    }
    assert len(_Told.last.words) == 3

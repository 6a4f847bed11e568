"""The norm bounds under a per-client learning rate (``local.lr_rule``): by
default every client is held to the round's bounds; with
``local.lr_rule_scales_bounds`` a client the rule speeds up s-fold has s times
the room under ``robust.max_norm_multiple`` and s times the clip bound, a
client slowed down keeps the round's bounds, and the norms are remembered as
they came. Checked on one
full-batch gradient step of a logistic regression, where the delta is exactly
-s * lr * grad: the norms are s times those of the run without the rule,
computed here from that run's uploads."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import TINY_LOGREG, MakeData

from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config import from_dict
from fedforge.config.notes import config_notes
from fedforge.core import wire
from fedforge.core.errors import ConfigError
from fedforge.engines import SimulationEngine
from fedforge.report.progress import Progress
from fedforge.robust.typical_norm import RelativeBound
from fedforge.server.experiment import build
from fedforge.server.round import configure, run_round
from fedforge.server.state import LoopState

SIZES = [12, 30, 18, 24]
SCALES = {0: 4.0, 2: 0.25}
MULTIPLE = 2.0


def test_a_client_sped_up_has_its_scale_times_the_room() -> None:
    """Recent norms 1, 1.5, 2: median 1.5, bound 2 x 1.5 = 3. A norm of 6 with
    room 4 (bound 12) is taken; with room 1 it is refused, and so is 13 with
    room 4. A round with nothing behind it: norms 1, 8, 2, 9, the lower middle
    2, the bound 4: 8 with room 4 is taken, 9 with room 1 is not."""
    bound = RelativeBound.of(MULTIPLE, [[1.0, 1.5, 2.0]])
    assert bound.refusal(6.0, 4.0) is None
    assert bound.refusal(6.0) == (
        "update norm 6 passes the bound 3 = robust.max_norm_multiple (2) x 1.5, "
        "the median norm of the updates taken in the last 1 round"
    )
    assert bound.refusal(13.0, 4.0) == (
        "update norm 13 passes the bound 12 = robust.max_norm_multiple (2) x 1.5 (the "
        "median norm of the updates taken in the last 1 round) x 4 (the client's lr scale)"
    )
    first = RelativeBound.of(MULTIPLE, [])
    why = first.cohort_refusals([1.0, 8.0, 2.0, 9.0], [1.0, 4.0, 1.0, 1.0])
    assert why[:3] == [None, None, None]
    assert "update norm 9 passes the bound 4 " in str(why[3])


def _csv(tmp: Path) -> str:
    path = tmp / "scales.csv"
    path.write_text("client_id,lr_scale\n" + "".join(f"{c},{s}\n" for c, s in SCALES.items()))
    return str(path)


def _cfg(tmp: Path | None, scaled: bool = True, **more: Any) -> Any:
    """The run; ``tmp``: where the scale file goes (None: no rule); ``scaled``:
    ``local.lr_rule_scales_bounds``."""
    rule = (
        {}
        if tmp is None
        else {
            "local": {"lr_rule": "lr_csv", "lr_rule_scales_bounds": scaled},
            "plugin_options": {"lr_csv": {"path": _csv(tmp)}},
        }
    )
    return from_dict(
        {
            **TINY_LOGREG,
            "num_clients": len(SIZES),
            "batch_size": None,  # one full-batch step: the delta is -s lr grad
            "local_epochs": 1,
            **rule,
            **more,
        }
    )


class _Recording(SimulationEngine):
    """The inner engine, each round's upload norms kept; a client in ``lr_of``
    trains at that lr, whatever lr the server gave it."""

    def __init__(self, inner: Any, lr_of: Mapping[int, float] | None = None) -> None:
        self.inner, self.name, self.lr_of = inner, inner.name, dict(lr_of or {})
        self.uploads: list[dict[int, float]] = []

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        tasks = [
            dataclasses.replace(t, plan=dataclasses.replace(t.plan, lr=self.lr_of[t.client_id]))
            if t.client_id in self.lr_of
            else t
            for t in tasks
        ]
        ups = list(self.inner.run_cohort(tasks, payload))
        self.uploads.append({u.client_id: _norm(u) for u in ups})
        yield from ups

    def run_phase(self, phase: str, messages: Any) -> dict[int, bytes]:
        return self.inner.run_phase(phase, messages)


def _norm(up: ClientUpload) -> float:
    return float(wire.decode(up.data).tensors["delta"].norm())


def _lower_median(xs: Sequence[float]) -> float:
    return sorted(xs)[(len(xs) - 1) // 2]


def _rounds(
    cfg: Any, data: Any, rounds: int = 1, lr_of: Mapping[int, float] | None = None
) -> tuple[LoopState, _Recording]:
    exp = build(cfg, data)
    exp.engine = rec = _Recording(exp.engine, lr_of)
    state = LoopState.fresh(exp)
    for r in range(rounds):
        run_round(exp, state, r, Progress(rounds, "t", enabled=False))
    return state, rec


def test_honest_clients_sped_up_by_the_rule_are_taken(make_data: MakeData, tmp_path: Path) -> None:
    """Client 0 steps at 4x the plan's lr: its norm is past 2x the lower middle
    of the round's norms, within 4x that; every update is taken, in this round
    and the next (judged against the remembered norms, as they came). The next
    round's clip bound is the multiple of their upper median (the clip's), x 4
    for client 0 and x 1 for client 2 (slowed down)."""
    data = make_data(SIZES, seed=5)
    robust = {"max_norm_multiple": MULTIPLE, "norm_window": 1}
    _, plain = _rounds(_cfg(None, robust=robust), data)
    state, rec = _rounds(_cfg(tmp_path, robust=robust), data)
    raw = rec.uploads[0]
    for c, n in raw.items():
        assert n == pytest.approx(SCALES.get(c, 1.0) * plain.uploads[0][c], rel=1e-12)
    typical = _lower_median(list(raw.values()))
    assert MULTIPLE * typical < raw[0] <= 4 * MULTIPLE * typical  # the test's premise
    assert state.rejected == []
    assert state.update_norms == [pytest.approx([raw[c] for c in sorted(raw)], rel=1e-12)]
    after, two = _rounds(_cfg(tmp_path, robust=robust, rounds=2), data, rounds=2)
    assert after.rejected == []
    assert MULTIPLE * typical < two.uploads[1][0] <= 4 * MULTIPLE * typical

    clip = _cfg(tmp_path, robust=robust, communication={"clip_multiple": 1.5})
    exp = build(clip, data)
    orders = configure(exp, state, 1, 1, list(range(len(SIZES))))
    got = {t.client_id: t.plan.upload_clip for t in orders.tasks}
    upper = sorted(raw.values())[len(raw) // 2]
    want = {c: max(1.0, SCALES.get(c, 1.0)) * 1.5 * upper for c in range(len(SIZES))}
    assert got == pytest.approx(want, rel=1e-12)
    assert orders.limits.room(0) == 4.0 and orders.limits.room(2) == 1.0


def test_by_default_a_client_sped_up_is_held_to_the_rounds_bounds(
    make_data: MakeData, tmp_path: Path
) -> None:
    """The same run without ``lr_rule_scales_bounds``: client 0's 4x step passes
    2x the round's median and is refused; the clip bound is the same for all."""
    data = make_data(SIZES, seed=5)
    robust = {"max_norm_multiple": MULTIPLE, "norm_window": 1}
    state, rec = _rounds(_cfg(tmp_path, False, robust=robust), data)
    raw = rec.uploads[0]
    typical = _lower_median(list(raw.values()))
    assert raw[0] > MULTIPLE * typical  # as in the test above
    assert [(r, c) for r, c, _ in state.rejected] == [(0, 0)]
    assert "lr scale" not in state.rejected[0][2]
    clip = _cfg(tmp_path, False, robust=robust, communication={"clip_multiple": 1.5})
    exp = build(clip, data)
    orders = configure(exp, state, 1, 1, list(range(len(SIZES))))
    typical = _lower_median(list(state.update_norms[0]))
    assert [t.plan.upload_clip for t in orders.tasks] == pytest.approx([1.5 * typical] * 4)
    assert orders.limits.room(0) == 1.0


def test_scaled_bounds_without_a_rule_are_refused_and_without_a_bound_noted(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="local.lr_rule_scales_bounds' = true is invalid"):
        _cfg(None, local={"lr_rule_scales_bounds": True})
    assert config_notes(_cfg(tmp_path)) == []  # the default max_norm_multiple is 10
    (note,) = config_notes(_cfg(tmp_path, robust={"max_norm_multiple": None}))
    assert note.startswith("local.lr_rule_scales_bounds = true scales no bound")
    clipped = _cfg(tmp_path, robust={"max_norm_multiple": None}, communication={"clip_multiple": 2})
    assert config_notes(clipped) == []


def test_an_update_past_its_room_is_refused(make_data: MakeData, tmp_path: Path) -> None:
    """Client 0, given 4x the plan's lr, steps at 16x: its norm passes 4x the
    bound; it is refused, the reason naming its scale, and the others are
    taken."""
    data = make_data(SIZES, seed=5)
    robust = {"max_norm_multiple": MULTIPLE, "norm_window": 1}
    _, plain = _rounds(_cfg(None, robust=robust), data)
    norms = {c: SCALES.get(c, 1.0) * n for c, n in plain.uploads[0].items()}
    norms[0] *= 4.0  # 16x the plan's lr
    assert norms[0] > 4 * MULTIPLE * _lower_median(list(norms.values()))  # the premise
    cfg = _cfg(tmp_path, robust=robust)
    state, rec = _rounds(cfg, data, lr_of={0: 16 * cfg.lr})
    assert rec.uploads[0][0] == pytest.approx(norms[0], rel=1e-12)
    assert [(r, c) for r, c, _ in state.rejected] == [(0, 0)]
    assert "x 4 (the client's lr scale)" in state.rejected[0][2]
    assert state.update_norms == [pytest.approx([norms[c] for c in (1, 2, 3)], rel=1e-12)]
    assert torch.isfinite(state.params).all()

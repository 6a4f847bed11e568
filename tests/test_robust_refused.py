"""The refused-fraction stop: over the last ``robust.refused_window`` upload rounds,
more than ``robust.max_refused_fraction`` of the updates asked for refused (the
client's own withheld updates aside) stops the run, as the skipped-round streak
does, with the reason in ``stall_stop``; a pure function of the loop state, so
a resumed run stops where the uninterrupted one did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData, SigtermAt
from tests.test_robust_gates import tiny

from fedforge.config import Config, override
from fedforge.core.errors import ConfigError
from fedforge.server import loop
from fedforge.server.loop import run
from fedforge.server.optimizers import ServerSGD
from fedforge.server.state import LoopState
from fedforge.server.stops import stalled
from fedforge.store import RoundRecord


def _refusing(window: int = 3, fraction: float | None = 0.5) -> Config:
    changes = {"robust.refused_window": window, "robust.max_refused_fraction": fraction}
    return override(Config(rounds=12, num_clients=10, client_fraction=0.5), changes)


def _record(r: int, cohort: int = 5) -> RoundRecord:
    return RoundRecord(r, cohort, 0.0, None, None, 0, 0, 0, 0.1, 0.0)


def test_the_refused_fraction_over_a_window_stops_a_run() -> None:
    """3 of 5 refused each round, none skipped: the fraction, not a streak, stops it."""
    state = LoopState(torch.zeros(2), ServerSGD(1.0))
    for r in range(3):
        state.records.append(_record(r))
        state.rejected += [(r, c, "non-finite update") for c in (1, 2, 3)]
        state.next_round = r + 1
        why = stalled(_refusing(), state)
        assert (why is None) == (r < 2)  # a whole window first
    assert "60% of the updates of the last 3 upload rounds were refused (9 of 15" in str(why)
    assert "since round 1" in str(why) and str(why).endswith("non-finite update")
    assert stalled(_refusing(fraction=0.6), state) is None  # more than the fraction
    assert stalled(_refusing(fraction=None), state) is None
    assert stalled(_refusing(window=4), state) is None


def test_withheld_updates_and_repeat_refusals_do_not_count() -> None:
    state = LoopState(torch.zeros(2), ServerSGD(1.0))
    for r in range(3):
        state.records.append(_record(r))
        state.rejected += [(r, 1, "bad"), (r, 1, "bad again"), (r, 2, "bad")]
        state.rejected += [(r, c, "withheld by the client: loss rose") for c in (3, 4)]
    state.next_round = 3
    assert stalled(_refusing(), state) is None  # 2 of 5 refused; the withheld aside
    state.rejected.append((2, 0, "bad"))  # 7 of 15 is not more than half
    assert stalled(_refusing(), state) is None
    state.rejected.append((1, 0, "bad"))
    assert "53% of the updates" in str(stalled(_refusing(), state))


def test_the_window_counts_upload_rounds_and_a_round_under_way() -> None:
    """upload_every = 2: the window is rounds 1, 3, 5; round 5 is not recorded yet
    (the round asks whether it ends the run): its cohort is drawn as the round's."""
    cfg = override(_refusing(), {"communication.upload_every": 2})
    state = LoopState(torch.zeros(2), ServerSGD(1.0))
    state.records = [_record(r) for r in range(5)]
    state.rejected = [(r, c, "bad") for r in (1, 3, 5) for c in (0, 1, 2)]
    state.next_round = 5
    assert "9 of 15" in str(stalled(cfg, state, last_round=5))
    assert stalled(cfg, state, last_round=4) is None  # rounds 1, 3 only


def test_a_mostly_refused_run_stops_within_the_window_and_resumes_exactly(
    make_data: MakeData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 of 5 clients send NaN every round, 2 finite updates: never skipped, so
    the streak rule never fires; the refused fraction (60%) stops the run at the
    end of the window. An honest run goes on; a run stopped by SIGTERM before
    the window and resumed stops where the uninterrupted one did."""
    data = make_data([4, 6, 5, 7, 4])
    cfg = override(
        tiny(5, rounds=12, tmp=tmp_path / "a", attack="nan_inf", attack_fraction=0.6),
        {"robust.refused_window": 4, "checkpoint_every": 1},
    )
    result = run(cfg, data=data)
    assert not result.skipped and len(result.rounds) == 4
    why = result.summary["stall_stop"]
    assert "60% of the updates of the last 4 upload rounds were refused (12 of 20" in why
    assert result.rounds[-1].test_accuracy is not None  # the run's last model is evaluated
    honest = run(override(cfg, {"robust.attack": "none", "robust.attack_fraction": 0.0,
                                "rounds": 6}), data=data, store=False)  # fmt: skip
    assert len(honest.rounds) == 6 and "stall_stop" not in honest.summary
    off = run(override(cfg, {"robust.max_refused_fraction": None, "rounds": 6}), data=data,
              store=False)  # fmt: skip
    assert len(off.rounds) == 6 and "stall_stop" not in off.summary

    real_build = loop.build

    def stopping_build(c: Any, d: Any = None, t: Any = None) -> Any:
        exp = real_build(c, d, t)
        exp.engine = SigtermAt(exp.engine, at=2)
        return exp

    monkeypatch.setattr(loop, "build", stopping_build)
    stopped = run(override(cfg, {"runs_dir": str(tmp_path / "b")}), data=data)
    assert stopped.stopped == "SIGTERM" and stopped.run_dir is not None
    monkeypatch.setattr(loop, "build", real_build)
    resumed = loop.resume(stopped.run_dir, data=data)
    assert len(resumed.rounds) == 4 and resumed.summary["stall_stop"] == why
    assert torch.equal(resumed.params, result.params)


def test_the_refused_fraction_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="robust.max_refused_fraction' = 1.0 is invalid"):
        override(Config(), {"robust.max_refused_fraction": 1.0}).robust.check()
    with pytest.raises(ConfigError, match="robust.refused_window' = 0 is invalid"):
        override(Config(), {"robust.refused_window": 0}).robust.check()

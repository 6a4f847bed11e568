"""The byte budget (``communication.byte_budget``): a run stops at the end of the
round whose bytes moved, up + down as the rounds record them, reach the budget;
that round's model is evaluated and the summary (``byte_stop``) and the
end-of-run facts say the budget stopped it and the score it reached."""

from __future__ import annotations

import dataclasses
import html
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData, SigtermAt
from tests.test_proxy import _cfg as proxy_cfg
from tests.test_proxy import _data as proxy_data
from tests.test_robust_gates import tiny

from fedforge.config import Config, from_dict, override
from fedforge.core.errors import ConfigError
from fedforge.report.facts import run_facts
from fedforge.report.html import report_html
from fedforge.server import loop
from fedforge.server.loop import run
from fedforge.server.stops import bytes_spent
from fedforge.store import RunStore


def _cfg(tmp: Path, rounds: int = 6) -> Config:
    # evaluated only in the last round: a stop must evaluate the model it ends with
    return override(tiny(5, rounds=rounds, tmp=tmp), {"evaluation.every": 1000, "model": "logreg"})


def _stops_after(per_round: list[int], budget: int) -> int:
    """The rounds run under ``budget``, counted from the bytes of each round."""
    moved = list(itertools.accumulate(per_round))
    return next((r + 1 for r, m in enumerate(moved) if m >= budget), len(per_round))


def test_a_run_stops_at_the_round_its_bytes_reach_the_budget(
    make_data: MakeData, tmp_path: Path
) -> None:
    data = make_data([4, 6, 5, 7, 4])
    free = run(_cfg(tmp_path / "free"), data=data)
    per_round = [r.bytes_up + r.bytes_down for r in free.rounds]
    budget = sum(per_round[:3]) + 1  # just past round 3's: round 4 reaches it
    assert _stops_after(per_round, budget) == 4
    cfg = override(_cfg(tmp_path / "b"), {"communication.byte_budget": budget})
    result = run(cfg, data=data)
    assert [r.round_idx for r in result.rounds] == [0, 1, 2, 3]
    assert [r.bytes_up + r.bytes_down for r in result.rounds] == per_round[:4]
    why = result.summary["byte_stop"]
    assert f"{sum(per_round[:4]):,} bytes moved (up + down) by the end of round 4" in why
    assert f"communication.byte_budget = {budget:,}" in why
    # the model it ends with is the one four rounds make, evaluated
    four = run(_cfg(tmp_path / "four", rounds=4), data=data)
    torch.testing.assert_close(result.params, four.params, rtol=0, atol=0)
    assert result.rounds[-1].test_accuracy == four.rounds[-1].test_accuracy
    assert result.summary["final_accuracy"] == four.rounds[-1].test_accuracy
    assert why.endswith(f"test accuracy {100 * four.rounds[-1].test_accuracy:.2f}% (round 4)")
    assert ("stopped", why) in run_facts(result.summary)
    with RunStore.open(result.run_dir, read_only=True) as store:
        assert html.escape(why) in report_html(store)  # under the report's title
    # exactly the bytes of the first three rounds: round 3 reaches it
    exact = run(override(cfg, {"communication.byte_budget": budget - 1}), data=data)
    assert len(exact.rounds) == 3 and exact.rounds[-1].test_accuracy is not None


@pytest.mark.parametrize("signalled", [1, 3])
def test_a_run_stopped_by_a_signal_and_resumed_stops_where_it_would_have(
    make_data: MakeData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signalled: int
) -> None:
    """SIGTERM in round 2, or in round 4 (the one reaching the budget, whose
    checkpoint is written before the budget is read): the resumed run ends after
    round 4 with the uninterrupted run's model and reason."""
    data = make_data([4, 6, 5, 7, 4])
    cfg = override(_cfg(tmp_path / "a"), {"checkpoint_every": 1})
    free = run(cfg, data=data, store=False)
    budget = sum(r.bytes_up + r.bytes_down for r in free.rounds[:3]) + 1
    cfg = override(cfg, {"communication.byte_budget": budget})
    whole = run(cfg, data=data)
    real_build = loop.build

    def stopping_build(c: Any, d: Any = None, t: Any = None) -> Any:
        exp = real_build(c, d, t)
        exp.engine = SigtermAt(exp.engine, at=signalled)
        return exp

    monkeypatch.setattr(loop, "build", stopping_build)
    stopped = run(override(cfg, {"runs_dir": str(tmp_path / "b")}), data=data)
    assert stopped.stopped == "SIGTERM" and stopped.run_dir is not None
    assert len(stopped.rounds) == signalled + 1
    monkeypatch.setattr(loop, "build", real_build)
    resumed = loop.resume(stopped.run_dir, data=data)
    assert len(resumed.rounds) == 4 and resumed.summary["byte_stop"] == whole.summary["byte_stop"]
    assert torch.equal(resumed.params, whole.params)


def test_a_budget_not_reached_or_reached_in_the_last_round_stops_nothing(
    make_data: MakeData, tmp_path: Path
) -> None:
    data = make_data([4, 6, 5, 7, 4])
    free = run(_cfg(tmp_path / "free", rounds=3), data=data)
    total = sum(r.bytes_up + r.bytes_down for r in free.rounds)
    for budget in (total, total + 1):  # the run ends there anyway
        cfg = override(
            _cfg(tmp_path / str(budget), rounds=3), {"communication.byte_budget": budget}
        )
        result = run(cfg, data=data)
        assert len(result.rounds) == 3 and "byte_stop" not in result.summary


def test_the_proxy_rows_a_round_ships_count_before_it_is_evaluated(tmp_path: Path) -> None:
    """Filling ships proxy rows to each client in its first cohort; they are in the
    round's downlink bytes, so a budget they alone reach stops the run there, with
    that round's model evaluated."""
    data = proxy_data()
    base = dataclasses.replace(proxy_cfg(tmp_path, size=6, fill_missing=True), rounds=6)
    base = override(base, {"client_fraction": 0.5, "evaluation.every": 1000})
    free = run(base, data=data)
    plain = run(dataclasses.replace(base, proxy=proxy_cfg(tmp_path, size=6).proxy), data=data)
    shipped = [f.bytes_down - p.bytes_down for f, p in zip(free.rounds, plain.rounds, strict=True)]
    late = [r for r in range(1, 5) if shipped[r] > 0]
    stop = late[0] if late else 0  # a round that ships rows (round 1 always does)
    moved = list(itertools.accumulate(r.bytes_up + r.bytes_down for r in free.rounds))
    budget = moved[stop]
    assert moved[stop] - shipped[stop] < budget  # the rows alone reach it
    result = run(override(base, {"communication.byte_budget": budget}), data=data)
    assert len(result.rounds) == stop + 1
    assert result.rounds[-1].test_accuracy is not None
    assert "byte_stop" in result.summary


def test_bytes_spent_says_nothing_below_the_budget_or_without_one() -> None:
    cfg = override(Config(), {"communication.byte_budget": 1000})
    assert bytes_spent(cfg, 999, 4) is None
    assert bytes_spent(Config(), 10**15, 4) is None
    assert bytes_spent(cfg, 1000, 4) == (
        "byte budget: 1,000 bytes moved (up + down) by the end of round 5 >= "
        "communication.byte_budget = 1,000"
    )


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (0, "must be an integer >= 1, or null (no budget)"),
        (-3, "must be an integer >= 1, or null (no budget)"),
        (2.5, "must be an integer, or null"),
        ("1GB", "must be an integer, or null"),
        (10**19, "must be an integer in [1, 1,000,000,000,000,000,000] (bytes)"),
    ],
)
def test_a_bad_byte_budget_is_one_config_error_line(value: object, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"communication": {"byte_budget": value}})
    text = str(err.value)
    assert "\n" not in text and "'communication.byte_budget'" in text and says in text

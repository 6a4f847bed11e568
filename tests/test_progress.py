"""What a run prints while it runs: on a file or a pipe one plain line a round
(tqdm's carriage-return redraws made a whole run one line of ^M), notes on the
same stream (stderr), never on stdout; the figures before the run's name."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from conftest import MakeData
from fedforge.report.progress import Progress


def test_not_a_terminal_gets_a_plain_line_per_round() -> None:
    stream = io.StringIO()
    bar = Progress(3, "a-long-run-name", enabled=True, stream=stream)
    bar.update(0.5, 1.25, 2048)
    bar.write("round 2: update of client 1 rejected: why")
    bar.update(None, None, 4096, epsilon=1.23456)
    bar.close()
    assert stream.getvalue().splitlines() == [
        "round 1/3 acc 50.00% loss 1.2500 bytes up+down 2.0 KiB  a-long-run-name",
        "round 2: update of client 1 rejected: why",
        "round 2/3 acc - loss - bytes up+down 4.0 KiB eps 1.235  a-long-run-name",
    ]
    assert "\r" not in stream.getvalue()


def test_notes_go_to_stderr_with_the_bar_off(capsys: pytest.CaptureFixture[str]) -> None:
    bar = Progress(2, "t", enabled=False)
    bar.write("fedforge: privacy budget: round 2 would take epsilon to 3.1; stopped")
    bar.update(0.5, 1.0, 10)
    bar.close()
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith("fedforge: privacy budget")


def test_a_resumed_run_counts_on_from_its_rounds() -> None:
    stream = io.StringIO()
    bar = Progress(5, "r", enabled=True, stream=stream, initial=3)
    bar.update(0.9, 0.3, 1)
    assert stream.getvalue().startswith("round 4/5 ")


def test_show_and_the_end_of_run_lines_say_what_ran(make_data: MakeData, tmp_path: Path) -> None:
    """A DP run under attack looked like a plain one in `fedforge show`: now both
    screens give the pipeline and engine, the attackers, the privacy spent, and
    show counts the refused updates."""
    from fedforge.config import from_dict
    from fedforge.report.runs import format_run_summary
    from fedforge.server.loop import run
    from fedforge.server.summary import format_summary
    from fedforge.store import RunStore

    cfg = {
        "model": "2nn", "num_clients": 6, "client_fraction": 1.0, "rounds": 2, "batch_size": 4,
        "target_accuracy": None, "dtype": "float64", "runs_dir": str(tmp_path),
        "privacy": {"dp": "central", "noise_multiplier": 1.0},
        "robust": {"attack": "nan_inf", "attack_fraction": 0.34},
    }  # fmt: skip
    result = run(from_dict(cfg), data=make_data([5, 6, 7, 8, 9, 10]))
    with RunStore.open(result.run_dir or "") as store:
        shown = format_run_summary(store)
    end = format_summary(result.summary)
    attackers = ", ".join(map(str, result.summary["attackers"]))
    for text in (shown, end):
        assert "dp_mean -> central_dp" in text and "engine)" in text
        assert f"2 simulated: clients {attackers}" in text
        assert f"epsilon {result.summary['privacy']['epsilon']:.3f}" in text
    assert "anomalies 4 updates refused (2 clients), 0 rounds skipped" in shown

"""A deployment's measured client times, by hand: a client's reported seconds
kept only within the server's own measurement, a round's rows, and the profile
``fedforge profile`` derives from such rows."""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedforge.cli import main
from fedforge.core.errors import DataError
from fedforge.selection.history import History
from fedforge.server.builtin_hooks import SelectionHook
from fedforge.server.hooks import RoundEnd
from fedforge.systems.calibrate import AVAILABILITY_NOTE, LATENCY_NOTE, measured_profiles
from fedforge.systems.profile import ClientProfile
from fedforge.transport.client_times import Arrival, bounded_times, round_rows, timed_update

NAN = math.nan


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


def test_a_report_within_the_servers_total_is_kept_and_the_upload_is_the_rest() -> None:
    m, why = bounded_times((1.5, 2.25), 5.0)
    assert why is None
    assert (m.download_s, m.compute_s, m.upload_s, m.total_s) == (1.5, 2.25, 1.25, 5.0)
    m, why = bounded_times((0.0, 5.0), 5.0)  # exactly the total: nothing left to upload
    assert why is None and m.upload_s == 0.0


@pytest.mark.parametrize(
    ("reported", "said"),
    [
        ((-0.1, 1.0), "must be finite numbers >= 0"),
        ((1.0, NAN), "must be finite numbers >= 0"),
        ((math.inf, 0.0), "must be finite numbers >= 0"),
        ((3.0, 2.5), "add up to more than the 5 s the server measured"),
    ],
)
def test_a_report_the_server_cannot_believe_is_refused_whole(
    reported: tuple[float, float], said: str
) -> None:
    """Refused, not clamped: the row keeps the server's total alone, so a liar
    cannot look faster than the server measured it."""
    m, why = bounded_times(reported, 5.0)
    assert why is not None and said in why and why.endswith("kept: the server's total alone)")
    assert math.isnan(m.download_s) and math.isnan(m.compute_s) and math.isnan(m.upload_s)
    assert m.total_s == 5.0


def test_no_report_keeps_the_total() -> None:
    m, why = bounded_times(None, 2.0)
    assert why is None and math.isnan(m.compute_s) and m.total_s == 2.0


def test_a_rounds_rows_dropouts_and_clients_closed_at_the_count() -> None:
    asked = [(4, 30), (1, 20), (7, 10)]  # (id, examples), in any order
    arrivals = {1: Arrival(3.0, 800, (1.0, 1.5)), 7: Arrival(2.0, 800, (5.0, 0.0))}
    rows, refused = round_rows(2, asked, 1000, arrivals, dropped=True)
    times = rows["client_times"]
    assert [r[:2] for r in times] == [(2, 1), (2, 4), (2, 7)]
    assert _same(times[0][2:], (1.0, 1.5, 0.5, 3.0, 1))
    assert _same(times[1][2:], (NAN, NAN, NAN, NAN, 0))  # asked, never came
    assert _same(times[2][2:], (NAN, NAN, NAN, 2.0, 1))  # its report refused
    assert rows["client_work"] == [
        (2, 1, 20, 1000, 800),
        (2, 4, 30, 1000, None),
        (2, 7, 10, 1000, 800),
    ]
    assert [c for c, _ in refused] == [7]
    # closed at an over-selected count: client 4 did not fail, it is left out
    rows, _ = round_rows(2, asked, 1000, arrivals, dropped=False)
    assert [r[1] for r in rows["client_times"]] == [1, 7]


def _rows() -> tuple[list[tuple], list[tuple]]:
    """Client 0: two rounds of 100 examples in 2 s and 4 s (50 and 25 a second),
    1,000 bytes down in 0.5 s and 0.25 s, 400 up in 0.2 s and 0.1 s. Client 1:
    asked twice, arrived once (60 examples in 1 s, 1,000 down in 1 s, 400 up in
    0.4 s). Client 2 arrived with its report refused; client 3 was never asked."""
    times = [
        (0, 0, 0.5, 2.0, 0.2, 2.7, 1),
        (1, 0, 0.25, 4.0, 0.1, 4.35, 1),
        (0, 1, None, None, None, None, 0),
        (1, 1, 1.0, 1.0, 0.4, 2.4, 1),
        (1, 2, None, None, None, 9.0, 1),
    ]
    work = [
        (0, 0, 100, 1000, 400),
        (1, 0, 100, 1000, 400),
        (0, 1, 60, 1000, None),
        (1, 1, 60, 1000, 400),
        (1, 2, 80, 1000, 400),
    ]
    return times, work


def test_profiles_from_hand_made_rows() -> None:
    times, work = _rows()
    profiles, notes = measured_profiles(times, work, 4)
    p0 = ClientProfile(0, 37.5, 3000.0, 3000.0, 0.0, 0.0)  # medians of (50, 25), (2000, 4000)...
    p1 = ClientProfile(1, 60.0, 1000.0, 1000.0, 0.0, 0.5)
    assert profiles[:2] == [p0, p1]
    # the measured clients' medians: of 37.5 and 60, 3000 and 1000; failure of 0, 0.5, 0
    filled = ClientProfile(2, 48.75, 2000.0, 2000.0, 0.0, 0.0)
    assert profiles[2] == filled
    assert profiles[3] == ClientProfile(3, 48.75, 2000.0, 2000.0, 0.0, 0.0)
    assert all(p.always_online for p in profiles)
    assert notes[:2] == [LATENCY_NOTE, AVAILABILITY_NOTE]
    assert notes[2] == (
        "clients 2-3: no training time measured; samples_per_s is the measured clients' "
        "median, 48.75"
    )
    assert notes[-1].startswith("clients 3: never asked to train; failure_prob")


def test_rows_that_measure_nothing_are_refused_in_one_line() -> None:
    times = [(0, 0, None, None, None, None, 0)]
    with pytest.raises(DataError, match="no client's samples_per_s can be derived"):
        measured_profiles(times, [(0, 0, 10, 100, None)], 2)


def test_the_selection_hook_keeps_each_arrived_uploads_measured_seconds() -> None:
    """The round's client_times rows (a deployment's, from ``Engine.end_round``)
    are the selection history's durations: arrived uploads only."""
    state = SimpleNamespace(selection=History(), outputs={})
    state.outputs["client_times"] = [
        (3, 0, 1.0, 2.0, 0.5, 3.5, 1),
        (3, 1, None, None, None, None, 0),
        (3, 2, None, None, None, 1.25, 1),
    ]
    info = SimpleNamespace(kind="upload", state=state, start=3, round_idx=3, cohort=[0, 1, 2])
    SelectionHook().round_end(info, RoundEnd(None, [], True, [0, 2]))  # type: ignore[arg-type]
    rows = state.selection.rows
    assert rows[0]["last_duration_s"] == 3.5 and rows[2]["last_duration_s"] == 1.25
    assert "last_duration_s" not in rows[1] and rows[1]["dropped"] == 1


def test_profile_refuses_what_is_not_a_deployment_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["profile", str(tmp_path / "empty"), "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a directory but not a run" in err


def test_profile_refuses_a_simulation_run_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedforge import config as config_mod
    from fedforge import run

    fields = {"name": "sim", "dataset": "synthetic", "model": "logreg", "num_clients": 3}
    more = {"client_fraction": 1.0, "rounds": 1, "engine": "serial", "runs_dir": str(tmp_path)}
    run(config_mod.from_dict({**fields, **more}), progress=False)
    capsys.readouterr()
    assert main(["profile", "sim", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "ran on the serial engine, not in a deployment: its client times are not" in err


def test_a_slowed_client_reports_its_training_times_the_factor() -> None:
    """``--slowdown 3``: a training of t seconds is followed by 2t asleep, and the
    report says 3t (at least: a busy machine may stretch the sleeps)."""

    def train(payload: bytes) -> bytes:
        time.sleep(0.05)
        return payload[::-1]

    data, timing = timed_update(lambda: b"abc", train, 3.0)
    assert data == b"cba"
    assert 0 <= timing.download_s < 0.05
    assert 0.15 <= timing.train_s < 1.0


def test_a_bad_slowdown_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["client", "--server", "127.0.0.1:1", "--clients", "0", "--insecure"]
    assert main([*args, "--slowdown", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "fedforge: error: --slowdown 0.5 is invalid: must be a number >= 1"

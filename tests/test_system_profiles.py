"""The profile CSV: written and read back exactly, each bad value refused in one
line naming the file, the line and the value."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedforge.core.errors import DataError
from fedforge.selection.history import History
from fedforge.systems import COLUMNS, ClientProfile, read_profiles, write_profiles


def test_profiles_round_trip_exactly(tmp_path: Path) -> None:
    profiles = [
        ClientProfile(0, 123.25, 1e6 / 3, 2.5e5, 0.05, 0.1, 3600.0, 600.0),
        ClientProfile(1, 0.1, 7.0, 9.0),  # always online, never fails
    ]
    path = tmp_path / "p.csv"
    write_profiles(path, list(reversed(profiles)))
    assert read_profiles(path, 2) == profiles
    assert read_profiles(path)[1].always_online and not profiles[0].always_online


def _csv(tmp_path: Path, header: str, *rows: str) -> Path:
    path = tmp_path / "p.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_columns_in_any_order_and_empty_availability(tmp_path: Path) -> None:
    header = ",".join(reversed(COLUMNS)).upper()
    path = _csv(tmp_path, header, ",,0,0.01,10,20,30,0")
    (p,) = read_profiles(path, 1)
    assert p == ClientProfile(0, 30.0, 20.0, 10.0, 0.01, 0.0, math.inf, 0.0)


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("0,0,1,1,0,0,,", "line 2: samples_per_s = '0'"),
        ("0,1,nan,1,0,0,,", "line 2: download_bps = 'nan'"),
        ("0,1,1,1,-1,0,,", "latency_s = '-1'"),
        ("0,1,1,1,0,1.5,,", "failure_prob = '1.5'"),
        ("0,1,1,1,0,0,0,5", "mean_online_s = '0'"),
        ("x,1,1,1,0,0,,", "client_id = 'x'"),
        ("0,1,1,1,0,0", "6 values, 8 expected"),
    ],
)
def test_bad_values_refused_in_one_line(tmp_path: Path, row: str, says: str) -> None:
    path = _csv(tmp_path, ",".join(COLUMNS), row)
    with pytest.raises(DataError, match=None) as e:
        read_profiles(path, 1)
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_population_must_match(tmp_path: Path) -> None:
    path = _csv(tmp_path, ",".join(COLUMNS), "0,1,1,1,0,0,,", "2,1,1,1,0,0,,")
    with pytest.raises(DataError, match=r"clients \[1\] missing"):
        read_profiles(path, 3)
    with pytest.raises(DataError, match="listed twice"):
        read_profiles(_csv(tmp_path, ",".join(COLUMNS), "0,1,1,1,0,0,,", "0,1,1,1,0,0,,"))


def test_history_keeps_durations_and_reads_older_checkpoints() -> None:
    h = History()
    h.round_done(0, 0, [0, 1], [0], {0: 0.5}, [], durations={0: 12.5, 1: math.inf})
    view = h.view([10, 20])
    assert view[0].last_duration_s == 12.5 and view[1].last_duration_s is None
    stored = h.state_dict()
    assert History.from_state(stored).view([10, 20])[0] == view[0]
    from fedforge.selection.history import _COLUMNS

    # written before durations were kept: the columns from last_duration_s on absent
    kept = 1 + _COLUMNS.index("last_duration_s")
    older = [row[:kept] for row in stored]
    assert History.from_state(older).view([10, 20])[0].last_duration_s is None


def test_client_time_by_hand() -> None:
    from fedforge.systems import client_time

    p = ClientProfile(0, samples_per_s=50.0, download_bps=1000.0, upload_bps=250.0, latency_s=0.5)
    t = client_time(p, down_bytes=4000, up_bytes=1000, examples=600)
    # 0.5 + 4000/1000 = 4.5; 600/50 = 12; 0.5 + 1000/250 = 4.5
    assert (t.download_s, t.compute_s, t.upload_s, t.total_s) == (4.5, 12.0, 4.5, 21.0)


def test_a_config_names_its_profiles(tmp_path: Path) -> None:
    from fedforge.config import from_dict
    from fedforge.systems import population

    path = tmp_path / "p.csv"
    write_profiles(path, [ClientProfile(c, 10.0 + c, 1e6, 1e5) for c in range(3)])
    cfg = from_dict({"num_clients": 3, "systems": {"profiles": str(path)}})
    assert [p.samples_per_s for p in population(cfg) or []] == [10.0, 11.0, 12.0]
    assert population(from_dict({"num_clients": 3})) is None
    with pytest.raises(DataError, match="clients \\[3, 4\\] missing"):
        population(from_dict({"num_clients": 5, "systems": {"profiles": str(path)}}))

"""Drawn populations against their configured distributions, the availability
process against its stationary law, the trace file, the population's summary,
and the ``systems:`` section's refusals, each in one line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedforge.config import Config, override
from fedforge.config.systems import SystemsConfig
from fedforge.core.errors import ConfigError, DataError
from fedforge.systems import Availability, ClientProfile
from fedforge.systems.availability import DAY_S, online_fraction
from fedforge.systems.draw import draw_profiles
from fedforge.systems.summary import format_population, population_summary
from fedforge.systems.trace import read_trace

# ----------------------------------------------------------------- drawn profiles


def test_drawn_quantiles_match_the_configured_medians_and_spreads() -> None:
    n = 4000
    systems = SystemsConfig(
        draw=True,
        compute_median=1000.0,
        compute_sigma=1.0,
        bandwidth_weights=(0.7, 0.3),
        download_median_bps=(1e6, 1e8),
        upload_median_bps=(1e5, 1e7),
        bandwidth_sigma=0.1,
        latency_median_s=0.02,
        latency_sigma=0.5,
    )
    profiles = draw_profiles(systems, seed=11, num_clients=n)
    compute = np.log([p.samples_per_s for p in profiles])
    # a sample median of n normal draws has standard deviation sqrt(pi / 2) sigma / sqrt(n)
    se = math.sqrt(math.pi / 2) / math.sqrt(n)
    assert abs(np.median(compute) - math.log(1000.0)) < 4 * se
    # the 90th / 10th percentile ratio of a lognormal: exp(2 * 1.2816 sigma)
    spread = np.quantile(compute, 0.9) - np.quantile(compute, 0.1)
    assert spread == pytest.approx(2 * 1.2816, abs=0.15)
    # the classes: 30% of the clients around the fast medians (a binomial share)
    fast = np.mean([p.download_bps > 1e7 for p in profiles])
    assert abs(fast - 0.3) < 4 * math.sqrt(0.3 * 0.7 / n)
    slow_up = [math.log(p.upload_bps) for p in profiles if p.download_bps < 1e7]
    assert abs(np.median(slow_up) - math.log(1e5)) < 4 * 0.1 * se * math.sqrt(n / len(slow_up))
    latency = np.log([p.latency_s for p in profiles])
    assert abs(np.median(latency) - math.log(0.02)) < 4 * 0.5 * se


def test_a_draw_is_a_function_of_the_seed() -> None:
    systems = SystemsConfig(draw=True)
    assert draw_profiles(systems, 3, 50) == draw_profiles(systems, 3, 50)
    assert draw_profiles(systems, 3, 50) != draw_profiles(systems, 4, 50)


# ------------------------------------------------------------------- availability


def _always(c: int, on: float = math.inf, off: float = 0.0) -> ClientProfile:
    return ClientProfile(c, 1.0, 1.0, 1.0, mean_online_s=on, mean_offline_s=off)


def test_the_on_off_process_is_online_its_stationary_fraction() -> None:
    on, off, clients = 100.0, 300.0, 50
    avail = Availability(7, [_always(c, on, off) for c in range(clients)])
    p = on / (on + off)
    horizon = 200 * (on + off)
    # the time average of a two-state chain over H has variance 2 p (1 - p) tau / H,
    # tau = on off / (on + off) its correlation time; the clients are independent
    tau = on * off / (on + off)
    se = math.sqrt(2 * p * (1 - p) * tau / horizon / clients)
    seen = np.mean([online_fraction(avail, c, horizon, 4000) for c in range(clients)])
    assert abs(seen - p) < 4 * se + 0.002  # + the sampling grid's error
    assert avail.fraction(0) == p


def test_the_daily_window_and_the_spells_end_where_said() -> None:
    avail = Availability(1, [_always(0)], daily_hours=6.0)
    assert online_fraction(avail, 0, 10 * DAY_S, 24 * 60 * 10) == pytest.approx(0.25, abs=1e-3)
    # online_until and next_online agree with what online says
    t = 0.0
    while not avail.online(0, t):
        t += 60.0
    until = avail.online_until(0, t)
    assert until - t <= 6 * 3600 and avail.online(0, until - 1e-6) and not avail.online(0, until)
    back = avail.next_online(0, until)
    assert back - until == pytest.approx(18 * 3600, rel=1e-9) and avail.online(0, back)
    # asked in any order, the answers are the same (spells drawn as far as asked)
    other = Availability(1, [_always(0, 50.0, 50.0)])
    late = other.online(0, 1e5)
    assert Availability(1, [_always(0, 50.0, 50.0)]).online(0, 1e5) == late


def test_a_trace_file_read_and_repeated(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("client_id,start_s,end_s\n0,0,10\n0,20,30\n1,5,6\n")
    trace = read_trace(path, 3)
    avail = Availability(0, [_always(c) for c in range(3)], trace=trace)
    assert trace[1] == 30.0
    assert [avail.online(0, t) for t in (5.0, 15.0, 25.0, 35.0)] == [True, False, True, True]
    assert avail.online_until(0, 25.0) == 30.0 and avail.next_online(0, 12.0) == 20.0
    assert not avail.online(2, 1.0) and avail.next_online(2, 0.0) == math.inf
    assert avail.fraction(0) == pytest.approx(20 / 30)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("client,start_s,end_s\n", "the header is client_id,start_s,end_s"),
        ("client_id,start_s,end_s\n0,5,3\n", "line 2: end_s = 3 is not after start_s"),
        ("client_id,start_s,end_s\n7,0,1\n", "line 2: client_id = '7'"),
        ("client_id,start_s,end_s\n0,0,10\n0,5,20\n", "line 3: start_s = 5 is before"),
        ("client_id,start_s,end_s\n0,x,1\n", "line 2: start_s = 'x'"),
    ],
)
def test_a_bad_trace_is_refused_in_one_line(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=said) as caught:
        read_trace(path, 3)
    assert "\n" not in str(caught.value)


# ------------------------------------------------------------------------ summary


def test_the_population_summary_holds_the_quantiles() -> None:
    profiles = [
        ClientProfile(c, 10.0 * (c + 1), 1e6, 5e5, 0.01 * c, 0.1, 100.0, 100.0) for c in range(11)
    ]
    summary = population_summary(profiles, Availability(0, profiles))
    assert summary["clients"] == 11
    assert summary["samples_per_s"] == {"p10": 20.0, "p50": 60.0, "p90": 100.0}
    assert summary["latency_s"]["p50"] == pytest.approx(0.05)
    assert summary["online_fraction"]["p50"] == 0.5
    lines = format_population(summary).splitlines()
    assert lines[1].split()[1:] == ["20", "/", "60", "/", "100", "examples/s"]
    assert lines[2].split()[1:6] == ["8", "/", "8", "/", "8"]  # 1e6 bytes/s: 8 Mbit/s


# ------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"systems.draw": True, "systems.profiles": "p.csv"}, "not both"),
        ({"systems.draw": True, "systems.download_median_bps": [1e6, 2e6]}, "one value per"),
        ({"systems.draw": True, "systems.bandwidth_weights": [0.0]}, "finite number > 0"),
        ({"systems.draw": True, "systems.daily_hours": 25}, "systems.daily_hours"),
        ({"systems.draw": True, "systems.compute_median": 0}, "systems.compute_median"),
        ({"systems.draw": True, "systems.failure_prob": 1.5}, "systems.failure_prob"),
        ({"systems.deadline_s": 10.0}, "without profiles"),
        ({"systems.draw": True, "privacy.dp": "central", "privacy.noise_multiplier": 1.0},
         "privacy accounting|privacy.dp"),
        ({"systems.draw": True, "communication.upload_every": 2}, "upload_every"),
    ],
)  # fmt: skip
def test_bad_systems_values_are_refused_in_one_line(fields: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        override(Config(), fields)
    assert "\n" not in str(caught.value)

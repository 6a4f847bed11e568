"""The ``systems:`` config section: each client's device and network profile
(systems/profile.py), read from a CSV or drawn from the distributions below,
when it can be reached (a two-state on/off process with a daily window, or a
trace file of online intervals), and the synchronous round's deadline and
over-selection on the simulator's virtual clock (systems/clock.py).

A drawn population: compute speed lognormal (``compute_median``,
``compute_sigma``); each client falls in one bandwidth class (weights
``bandwidth_weights``, medians ``download_median_bps`` and
``upload_median_bps``, one entry per class) and draws its download and upload
bandwidth lognormal around that class's medians (``bandwidth_sigma``);
latency lognormal (``latency_median_s``, ``latency_sigma``); one failure
probability for every client.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from fedforge.config.ranges import Range
from fedforge.core.errors import ConfigError


@dataclass(frozen=True)
class SystemsConfig:
    """Where the clients' system profiles come from (none: no virtual clock,
    every client equally fast and always online) and the round's rules on the
    virtual clock."""

    # a CSV of one profile per client (systems/profile.py's columns), e.g. one
    # `fedforge profile` wrote from a deployment; null: no profiles
    profiles: str | None = None
    # draw every client's profile from the distributions below (seeded by the run's seed)
    draw: bool = False
    compute_median: Annotated[float, Range("> 0", note="training examples a second")] = 1000.0
    compute_sigma: Annotated[float, Range("[0, 10]", note="of the log; 0: all equal")] = 1.0
    # the bandwidth classes: their weights and medians (bytes a second), one entry each
    bandwidth_weights: tuple[float, ...] = (1.0,)
    download_median_bps: tuple[float, ...] = (2.5e6,)
    upload_median_bps: tuple[float, ...] = (1.25e6,)
    bandwidth_sigma: Annotated[float, Range("[0, 10]", note="of the log, within a class")] = 0.5
    latency_median_s: Annotated[float, Range(">= 0", note="seconds, each way")] = 0.05
    latency_sigma: Annotated[float, Range("[0, 10]", note="of the log")] = 0.5
    failure_prob: Annotated[float, Range("[0, 1]", note="a started round fails")] = 0.0
    # availability of drawn clients: mean seconds of an online and an offline
    # spell (exponential); mean_offline_s 0: always online (the daily window aside)
    mean_online_s: Annotated[float, Range("> 0", note="seconds")] = 3600.0
    mean_offline_s: Annotated[float, Range(">= 0", note="seconds; 0: never offline")] = 0.0
    # hours a day each client may be online, in a window that starts at a
    # per-client time of day drawn from the seed (24: no daily cycle)
    daily_hours: Annotated[float, Range("(0, 24]", note="hours")] = 24.0
    # a CSV of online intervals (client_id,start_s,end_s), repeated after its
    # last end: in place of the on/off process and the daily window
    trace: str | None = None
    # a round ends at this many seconds of virtual time; later uploads are dropouts
    deadline_s: Annotated[float | None, Range("> 0", null="no deadline")] = None
    # ask ceil((1 + f) K) clients and take the first K uploads to arrive
    over_selection: Annotated[float, Range("[0, 10]", note="0: ask exactly K")] = 0.0

    @property
    def enabled(self) -> bool:
        return self.profiles is not None or self.draw

    def check(self) -> None:
        if self.profiles is not None and self.draw:
            raise ConfigError(
                f"systems.profiles = {self.profiles!r} with systems.draw = true: the profiles "
                "come from the CSV or from the distributions, not both"
            )
        classes = len(self.bandwidth_weights)
        for name in ("bandwidth_weights", "download_median_bps", "upload_median_bps"):
            values = getattr(self, name)
            if len(values) != classes or classes == 0:
                raise ConfigError(
                    f"config field 'systems.{name}' = {list(values)} is invalid: one value "
                    f"per bandwidth class, as many as systems.bandwidth_weights ({classes}, >= 1)"
                )
            if not all(math.isfinite(v) and v > 0 for v in values):
                raise ConfigError(
                    f"config field 'systems.{name}' = {list(values)} is invalid: "
                    "every value must be a finite number > 0"
                )
        if not self.enabled and (self.trace is not None or self.deadline_s is not None):
            what = "trace" if self.trace is not None else "deadline_s"
            raise ConfigError(
                f"systems.{what} is set without profiles: set systems.profiles (a CSV) "
                "or systems.draw = true"
            )


def systems_fit_run(
    systems: SystemsConfig, dp: str, tiers: bool, secagg: bool, upload_every: int
) -> None:
    """The virtual clock drops the clients that are offline, fail or come late:
    the cohort is then no uniform sample of rate client_fraction, which the
    privacy accounting assumes, and secure aggregation's threshold is drawn from
    the clients asked. An upload period's cohort is drawn at its first round,
    the clock's pool at its last."""
    if not systems.enabled:
        return
    uses = None
    if dp != "none":
        uses = f"privacy.dp = '{dp}'"
    elif tiers:
        uses = "privacy tiers"
    elif secagg:
        uses = "privacy.secagg"
    elif upload_every > 1:
        uses = f"communication.upload_every = {upload_every}"
    if uses is not None:
        raise ConfigError(
            f"systems (the virtual clock) with {uses}: availability, failures and the "
            "deadline change which clients a round hears from; unset systems.profiles and "
            "systems.draw, or turn that off"
        )

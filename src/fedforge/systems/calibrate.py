"""A population's profiles from a deployment's measured client times (``fedforge
profile``): what each client's rounds in ``fedforge server`` say of its speed,
bandwidth and reliability, as the CSV the simulator reads (``profile.py``).

Per client, over the rounds it was asked to train (the run store's
``client_times`` and ``client_work`` rows, one per asked client and round):

- ``samples_per_s``: examples its training processed / its training seconds;
- ``download_bps``: the payload's bytes / its download seconds, less latency;
- ``upload_bps``: its update's bytes / its upload seconds, less latency;

each the median over its arrived rounds (the median: a few rounds slowed by
something else, a busy host, do not move it), and ``failure_prob``: the
fraction of the rounds it was asked whose upload never came. A round's
seconds add up to the server's own measurement (``transport/client_times.py``),
so a population replayed on the virtual clock takes the measured time.

The availability (``mean_online_s``, ``mean_offline_s``) comes from the
server's record of when each client was connected (``systems/measured_availability.py``;
a run without that record: every client always online, said in a note).

What a deployment's records do not separate, said in a note: latency (every
exchange of a run has the same sizes, so a fixed cost per exchange and a
bandwidth fit the same seconds: ``latency_s`` is 0 and the bandwidths are
effective ones, latency included, exact at this run's payload sizes). A client
never measured (never asked, or its times refused) takes the measured clients'
median of what it lacks, named in a note.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fedforge.core.errors import DataError
from fedforge.core.ids import format_ids
from fedforge.systems.measured_availability import AVAILABILITY_NOTE, availability
from fedforge.systems.profile import ClientProfile

Spells = Sequence[tuple[int, float, float, int, int, float]]

LATENCY_NOTE = (
    "latency_s is 0: this run's exchanges all had the same sizes, which do not separate "
    "latency from bandwidth; the bandwidths are effective (latency included), exact at "
    "this run's payload and update sizes"
)
# what a client lacks when a quantity of its profile was not measured
_WHAT = {
    "samples_per_s": "no training time measured",
    "download_bps": "no download time measured",
    "upload_bps": "no upload time measured",
    "failure_prob": "never asked to train",
}


@dataclass
class _Client:
    """One client's rounds: the per-round values of each quantity."""

    asked: int = 0
    arrived: int = 0
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, num: Any, seconds: Any) -> None:
        """``num / seconds`` when both are known and positive."""
        if num is None or seconds is None:
            return
        if float(seconds) > 0 and float(num) > 0:
            self.values.setdefault(name, []).append(float(num) / float(seconds))


def _per_client(
    times: Sequence[Sequence[Any]], work: Sequence[Sequence[Any]], num_clients: int
) -> dict[int, _Client]:
    """Each client's rounds, from ``client_times`` rows (round, client, download_s,
    compute_s, upload_s, total_s, arrived) and ``client_work`` rows (round, client,
    examples, bytes_down, bytes_up)."""
    moved = {(int(w[0]), int(w[1])): w[2:] for w in work}
    clients: dict[int, _Client] = {}
    for r, c, down_s, compute_s, up_s, _total, arrived in times:
        if int(c) >= num_clients:  # not of this federation: nothing to say of it
            continue
        one = clients.setdefault(int(c), _Client())
        one.asked += 1
        if not arrived:
            continue
        one.arrived += 1
        examples, bytes_down, bytes_up = moved.get((int(r), int(c)), (None, None, None))
        one.add("samples_per_s", examples, compute_s)
        one.add("download_bps", bytes_down, down_s)
        one.add("upload_bps", bytes_up, up_s)
    return clients


def measured_profiles(
    times: Sequence[Sequence[Any]],
    work: Sequence[Sequence[Any]],
    num_clients: int,
    presence: tuple[Spells, Sequence[tuple[float, float]]] | None = None,
) -> tuple[list[ClientProfile], list[str]]:
    """Every client's profile, ids 0..``num_clients``-1, from a deployment's rows
    (``presence``: its spells and watches, ``systems/measured_availability.py``; None: not
    recorded, every client always online), and the notes that say what was not
    measured. DataError when no client's speed and bandwidths were measured at all."""
    clients = _per_client(times, work, num_clients)
    own: dict[int, dict[str, float]] = {}
    for c, one in clients.items():
        values = {name: statistics.median(v) for name, v in one.values.items()}
        values["failure_prob"] = (one.asked - one.arrived) / one.asked
        own[c] = values
    medians = {}
    for name in _WHAT:
        measured = [v[name] for v in own.values() if name in v]
        if not measured:
            raise DataError(
                f"no client's {name} can be derived from the run's records ({_WHAT[name]}): "
                "fedforge server records the times of each client it asks to train"
            )
        medians[name] = statistics.median(measured)
    spells, watches = presence if presence is not None else ((), None)
    on_off, said = availability(spells, watches, num_clients)
    notes = [LATENCY_NOTE, *said]
    for name, what in _WHAT.items():
        lacking = [c for c in range(num_clients) if name not in own.get(c, {})]
        if lacking:
            notes.append(
                f"clients {format_ids(lacking, most=10, sep=', ')}: {what}; {name} is "
                f"the measured clients' median, {medians[name]:.6g}"
            )
    profiles = [
        ClientProfile(
            c,
            **{name: own.get(c, {}).get(name, medians[name]) for name in _WHAT},
            mean_online_s=on_off[c][0],
            mean_offline_s=on_off[c][1],
        )
        for c in range(num_clients)
    ]
    return profiles, notes


__all__ = ["AVAILABILITY_NOTE", "LATENCY_NOTE", "measured_profiles"]

"""How long one client's part of a round takes on the virtual clock.

A client's time, from the moment the server hands it the payload, is

    download_s = latency_s + payload bytes / download_bps
    compute_s  = examples processed / samples_per_s
    upload_s   = latency_s + update bytes / upload_bps

with the bytes those that really travel (the encoded payload and update, so a
codec's saving shows in time as in bytes) and the examples the local work
really processes (epochs times the client's examples, or its steps times the
batch). The clock is bookkeeping on numbers the round already has: it adds no
work to training.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fedforge.systems.profile import ClientProfile


@dataclass(frozen=True)
class ClientTime:
    """One client's round on the virtual clock, in seconds."""

    download_s: float
    compute_s: float
    upload_s: float

    @property
    def total_s(self) -> float:
        return self.download_s + self.compute_s + self.upload_s


def client_time(
    profile: ClientProfile, down_bytes: int, up_bytes: int, examples: int
) -> ClientTime:
    """The time ``profile``'s client takes to download ``down_bytes``, process
    ``examples`` training examples and upload ``up_bytes``."""
    return ClientTime(
        download_s=profile.latency_s + down_bytes / profile.download_bps,
        compute_s=examples / profile.samples_per_s,
        upload_s=profile.latency_s + up_bytes / profile.upload_bps,
    )


@dataclass(frozen=True)
class RoundClose:
    """How a synchronous round ends on the virtual clock."""

    taken: list[int]  # the uploads that arrived in time, in arrival order
    duration_s: float  # from the round's start to its end
    dropped: dict[int, str]  # the other trained clients: why each dropped out


def close_round(
    totals: Mapping[int, float],
    offline_s: Mapping[int, float],
    target: int,
    deadline_s: float | None,
) -> RoundClose:
    """The round of clients that take ``totals[c]`` seconds from its start and go
    offline ``offline_s[c]`` seconds after it (inf: not before the end). A client
    offline before it finishes, or finishing after ``deadline_s``, drops out; the
    others arrive in order of time (ties by id) and the first ``target`` are
    taken, the rest dropped. The round ends at the ``target``-th arrival; short
    of it, at the deadline, or without one when the last client it waits for
    arrives or goes offline."""
    dropped: dict[int, str] = {}
    arrivals: list[tuple[float, int]] = []
    seen_gone = 0.0  # the last time a client was seen to go
    for c, total in totals.items():
        if total > offline_s[c]:
            dropped[c] = f"offline {offline_s[c]:.6g} s into the round, before it finished"
            seen_gone = max(seen_gone, offline_s[c])
        elif deadline_s is not None and total > deadline_s:
            dropped[c] = f"finished at {total:.6g} s, after the deadline of {deadline_s:g} s"
        else:
            arrivals.append((total, c))
    arrivals.sort()
    taken = arrivals[:target]
    for total, c in arrivals[target:]:
        dropped[c] = f"arrived at {total:.6g} s, after the first {target} uploads"
    if taken and len(taken) == target:
        duration = taken[-1][0]
    elif deadline_s is not None:
        duration = deadline_s
    else:
        duration = max([seen_gone, *(t for t, _ in taken)])
    return RoundClose([c for _, c in taken], duration, dropped)


__all__ = ["ClientTime", "RoundClose", "client_time", "close_round"]

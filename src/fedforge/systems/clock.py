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


__all__ = ["ClientTime", "client_time"]

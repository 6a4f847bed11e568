"""A deployment's measured client times: how long each client asked to train
took to download the model, train and upload its update, the rows of the run
store's ``client_times`` (and of ``client_work``: the examples and bytes those
seconds moved, from which ``fedforge profile`` derives speeds and bandwidths).

Who measures what:

- the server: the total, from the moment the work was handed to the client's
  poll to the moment its whole upload had arrived (``Answer.seconds``);
- the client: its download (request to last chunk) and its local training,
  sent in the upload's header (``Timing``);
- the upload is the rest, total minus download minus training: the upload
  itself and every wait the client did not report (the work's way to the
  client; a process hosting several clients does their work one after the
  other).

A client's report is not trusted. It is kept only when both numbers are
finite, >= 0 and together within the total the server measured; otherwise it
is refused whole, with the reason (never clamped: which part to cut would be a
guess), and the row keeps the server's total alone. So the three parts always
add up to the server's own measurement: a client may shift its seconds between
computing and uploading, never make its round look shorter than it was.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedforge.transport.pb import federation_pb2 as pb

NAN = math.nan


def timed_update(
    download: Callable[[], bytes], train: Callable[[bytes], bytes], slowdown: float = 1.0
) -> tuple[bytes, pb.Timing]:
    """The client's half: download the payload, train on it, and time both.
    ``slowdown`` F > 1 emulates a device F times slower (``fedforge client
    --slowdown``): each training of t seconds is followed by (F - 1) t more of
    sleep, counted as training."""
    t0 = time.monotonic()
    payload = download()
    t1 = time.monotonic()
    data = train(payload)
    if slowdown > 1:
        time.sleep((slowdown - 1) * (time.monotonic() - t1))
    return data, pb.Timing(download_s=t1 - t0, train_s=time.monotonic() - t1)


@dataclass(frozen=True)
class Measured:
    """One asked client's round, in seconds (NaN: not known)."""

    download_s: float
    compute_s: float
    upload_s: float
    total_s: float


def bounded_times(
    reported: tuple[float, float] | None, total_s: float
) -> tuple[Measured, str | None]:
    """The parts of a round the server measured at ``total_s`` seconds, given the
    client's ``reported`` (download, training) seconds (None: it said nothing),
    and why the report was refused (None: kept, or none)."""
    if reported is None:
        return Measured(NAN, NAN, NAN, total_s), None
    down, train = reported
    why = None
    if not all(math.isfinite(v) and v >= 0 for v in (down, train)):
        why = "must be finite numbers >= 0"
    elif down + train > total_s:
        why = (
            f"add up to more than the {total_s:.6g} s the server measured from hand-out to arrival"
        )
    if why is not None:
        return Measured(NAN, NAN, NAN, total_s), (
            f"reported download_s = {down:.6g}, train_s = {train:.6g} {why}; "
            "refused (kept: the server's total alone)"
        )
    return Measured(down, train, total_s - down - train, total_s), None


@dataclass(frozen=True)
class Arrival:
    """An update that arrived: its server-measured seconds, its size and what
    the client said of its times."""

    seconds: float
    bytes_up: int
    reported: tuple[float, float] | None


def round_rows(
    round_idx: int,
    asked: Sequence[tuple[int, int]],
    payload_bytes: int,
    arrivals: Mapping[int, Arrival],
    dropped: bool,
) -> tuple[dict[str, list[tuple[Any, ...]]], list[tuple[int, str]]]:
    """The ``client_times`` and ``client_work`` rows of one round whose clients
    ``asked`` (id, examples its training processes) were handed a payload of
    ``payload_bytes``, with the uploads that ``arrivals`` holds; the others are
    dropouts when ``dropped`` (the round waited for them), else left out (closed
    at an over-selected count: not a failure of theirs). Also each refused
    report's (client, reason)."""
    times: list[tuple[Any, ...]] = []
    work: list[tuple[Any, ...]] = []
    refused: list[tuple[int, str]] = []
    for cid, examples in sorted(asked):
        got = arrivals.get(cid)
        if got is None:
            if dropped:
                times.append((round_idx, cid, NAN, NAN, NAN, NAN, 0))
                work.append((round_idx, cid, examples, payload_bytes, None))
            continue
        m, why = bounded_times(got.reported, got.seconds)
        if why is not None:
            refused.append((cid, why))
        times.append((round_idx, cid, m.download_s, m.compute_s, m.upload_s, m.total_s, 1))
        work.append((round_idx, cid, examples, payload_bytes, got.bytes_up))
    return {"client_times": times, "client_work": work}, refused


__all__ = ["Arrival", "Measured", "bounded_times", "round_rows", "timed_update"]

"""What buffered asynchronous aggregation carries from one server step to the
next: the virtual clock's time, the clients training and the updates each will
deliver, and how many draws of clients the current round made. It is saved
with every checkpoint (the updates as bytes, beside the model) and read back,
so a resumed run delivers the same updates at the same times.

A dispatched client's update is computed when it is handed work (it trains on
the model of that moment) and held until its arrival on the virtual clock;
between server steps the buffer itself is always empty (a step empties it, and
a checkpoint is written between steps), so the updates in flight are all there
is to keep (``Checkpoint.in_flight``, by client id).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import torch

from fedforge.store import CheckpointError
from fedforge.systems.profile import ClientProfile


@dataclass(frozen=True, order=True)
class InFlight:
    """A client at work: it arrives at ``arrives`` (virtual seconds) with ``data``,
    the update it trained from round ``version``'s model (None: it fails before
    uploading, its slot is free at ``arrives``). Ordered by arrival, then client id."""

    arrives: float
    client_id: int
    version: int = field(compare=False)
    started: float = field(compare=False)
    download_s: float = field(compare=False)
    compute_s: float = field(compare=False)
    upload_s: float = field(compare=False)
    data: bytes | None = field(compare=False, repr=False)


@dataclass
class BufferedState:
    """The buffered loop's clock, its clients at work (a heap by arrival) and the
    draws of clients made in round ``draws_round``."""

    now: float = 0.0
    in_flight: list[InFlight] = field(default_factory=list)
    draws_round: int = 0
    draws: int = 0
    # the run's system profiles, read once a process (not checkpointed)
    profiles: list[ClientProfile] | None = field(default=None, compare=False, repr=False)
    loaded: bool = field(default=False, compare=False, repr=False)

    def push(self, entry: InFlight) -> None:
        heapq.heappush(self.in_flight, entry)

    def pop(self) -> InFlight:
        return heapq.heappop(self.in_flight)

    def next_arrival(self) -> float | None:
        return self.in_flight[0].arrives if self.in_flight else None

    def busy(self) -> set[int]:
        return {e.client_id for e in self.in_flight}

    def next_draw(self, round_idx: int) -> int:
        """The index of the next draw of clients in ``round_idx`` (0 first)."""
        if self.draws_round != round_idx:
            self.draws_round, self.draws = round_idx, 0
        self.draws += 1
        return self.draws - 1

    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Plain JSON data (floats round-trip exactly) and the updates' bytes."""
        rows = []
        tensors: dict[str, torch.Tensor] = {}
        for e in sorted(self.in_flight):
            rows.append(
                [
                    e.client_id,
                    e.version,
                    e.started,
                    e.arrives,
                    e.download_s,
                    e.compute_s,
                    e.upload_s,
                    e.data is not None,
                ]  # fmt: skip
            )
            if e.data is not None:
                tensors[str(e.client_id)] = torch.frombuffer(bytearray(e.data), dtype=torch.uint8)
        meta = {"now": self.now, "in_flight": rows, "draws": [self.draws_round, self.draws]}
        return meta, tensors

    @classmethod
    def from_state(cls, meta: Any, tensors: dict[str, torch.Tensor]) -> BufferedState:
        """The state a checkpoint holds; one that holds none is refused (the run
        was checkpointed in synchronous rounds)."""
        if not isinstance(meta, dict):
            raise CheckpointError(
                "the checkpoint holds no asynchronous state: it was written by a run "
                "in synchronous rounds (asynchronous.mode = 'sync')"
            )
        state = cls(float(meta["now"]), [], int(meta["draws"][0]), int(meta["draws"][1]))
        for cid, version, started, arrives, down, comp, up, has in meta["in_flight"]:
            data = None
            if has:
                blob = tensors.get(str(int(cid)))
                if blob is None:
                    raise CheckpointError(f"the update of client {cid} in flight is missing")
                data = blob.numpy().tobytes()
            entry = InFlight(
                float(arrives), int(cid), int(version), float(started), float(down),
                float(comp), float(up), data,
            )  # fmt: skip
            state.push(entry)
        return state


__all__ = ["BufferedState", "InFlight"]

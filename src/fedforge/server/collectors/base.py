"""What every collector shares (DESIGN idea 7): the phase it asks for, what it
hands back, and the round's log of refusals and skips.

A collector receives one round's messages one at a time and in any order. It
says which phase comes next and to whom (``upcoming``), hands out that phase's
messages (``next_phase``: a phase of model uploads, or a protocol phase such as
secure aggregation's key agreement), takes each reply (``reply``) and each
upload (``offer``: accepted, or refused with a reason that is recorded; a
collector that ``holds`` may still refuse it at the end), is told
of clients that dropped (``dropout``), closes the phase (``end_phase``) and
finishes with the aggregate and its accounting (``finish``). The simulator
drives it with function calls (``server/collect.py``); a deployment server
drives the same object from network messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from fedforge.engines.partial import PartialSum, Summing
from fedforge.report.progress import Progress
from fedforge.store import ClientRecord

MAX_REASON = 500  # characters of a refusal's reason that are kept
FLOAT32_BYTES = 4  # what dense float32 messages would cost (paper_bytes: 2 |w| K 4)
UPLOAD = "upload"  # the name of a phase of model uploads


@dataclass(frozen=True)
class Phase:
    """One phase of a round: a message to each addressed client (answered through
    ``Collector.reply``) and the clients that receive the payload, train and
    upload (answered through ``Collector.offer``)."""

    name: str
    messages: Mapping[int, bytes] = field(default_factory=dict)
    train: Sequence[int] = ()


@dataclass
class Collected:
    """A finished collection: the aggregate (None: nothing to apply, the reason is
    in the log) and what crossed the wire."""

    aggregate: torch.Tensor | None
    clients: dict[int, ClientRecord]  # the clients whose updates the aggregate holds
    # the algorithm's tensors that reached the server (SCAFFOLD's delta c_k): one
    # mapping per client, or per edge under hierarchical aggregation
    received: list[dict[str, torch.Tensor]]
    bytes_up: int
    bytes_down: int
    float32_up: int  # the messages that travelled up, as dense float32
    float32_down: int
    hops: int = 0  # server <-> edge messages (hierarchical aggregation)
    # the clients whose uploads reached the server, taken or refused, the round
    # applied or not (collect.py fills it in: what the DP accountant charges)
    arrived: frozenset[int] = frozenset()
    # each used client's update norm as decoded, before any stage (the bound
    # relative to recent norms remembers them); none under secure aggregation
    norms: dict[int, float] = field(default_factory=dict)
    # each used client's update norm before its own clip, as it reported it (as
    # decoded if it reported none): communication.clip_multiple's median counts them
    clip_norms: dict[int, float] = field(default_factory=dict)
    # the uploads ``offer`` took that the round refused at its end (``Collector.holds``)
    refused_at_end: dict[int, str] = field(default_factory=dict)

    def taken_norms(self) -> list[float]:
        """The taken updates' norms in client order (what the round adds to the
        recent norms)."""
        return [self.norms[c] for c in sorted(self.norms)]

    def taken_clip_norms(self) -> list[float]:
        """The taken updates' norms before their clients' clip, in client order."""
        return [self.clip_norms[c] for c in sorted(self.clip_norms)]


class Collector(Protocol):
    """One round's collection of updates into an aggregate."""

    def upcoming(self) -> tuple[str, list[int]] | None:
        """The next phase's name and the clients it will address; None when done."""
        ...

    def next_phase(self) -> Phase | None:
        """The next phase's messages, for the addressed clients not known to have
        dropped; None when the round cannot go on (the reason is logged)."""
        ...

    def reply(self, client_id: int, data: bytes) -> None:
        """A client's reply to the current phase's message."""
        ...

    def offer(self, client_id: int, data: bytes) -> str | None:
        """An upload: None when accepted, else why it was refused."""
        ...

    @property
    def holds(self) -> bool:
        """Whether an upload ``offer`` accepts is judged again at the round's end
        (its verdict then: ``Collected.refused_at_end``)."""
        ...

    def dropout(self, client_id: int) -> None:
        """Client ``client_id`` is gone (before the next phase reaches it)."""
        ...

    def end_phase(self) -> None:
        """The current phase is over: who did not answer has dropped out."""
        ...

    def summing(self) -> Summing | None:
        """What the workers that train the clients need to judge and sum the
        upload phase's updates themselves (partial.py); None: each is offered."""
        ...

    def take_share(self, share: PartialSum) -> list[int]:
        """One worker's judged and summed uploads (only when ``summing`` gave one);
        the clients whose uploads it holds."""
        ...

    def finish(self) -> Collected: ...


class RoundLog:
    """Where a round's refusals and skips go: the loop state's lists (kept in
    every checkpoint) and one line each for the user."""

    def __init__(
        self,
        rejected: list[tuple[int, int, str]],
        skipped: list[tuple[int, str]],
        bar: Progress,
        round_idx: int,
        on_reject: Callable[[int, str], None] | None = None,
    ) -> None:
        self.rejected, self.skipped, self.bar, self.round_idx = rejected, skipped, bar, round_idx
        self.on_reject = on_reject  # told each refusal (the round's hooks)

    def reject(self, client_id: int, why: str) -> None:
        if len(why) > MAX_REASON:  # kept in every later checkpoint: a client cannot fill it
            why = why[: MAX_REASON - 3] + "..."
        self.rejected.append((self.round_idx, client_id, why))
        self.write(f"update of client {client_id} rejected: {why}")
        if self.on_reject is not None:
            self.on_reject(client_id, why)

    def skip(self, why: str) -> None:
        self.skipped.append((self.round_idx, why))
        self.write(f"skipped, the global model is unchanged: {why}")

    @property
    def skipped_now(self) -> bool:
        return bool(self.skipped) and self.skipped[-1][0] == self.round_idx

    def write(self, text: str) -> None:
        self.bar.write(f"round {self.round_idx + 1}: {text}")


@dataclass(frozen=True)
class DenseCost:
    """What one message costs as dense float32: the model and the algorithm's
    tensors beside it (SCAFFOLD's c) down; the delta up, and beside it the
    algorithm's tensors each at its own size (SCAFFOLD's delta c_k a model
    vector, FedNova's n_i a_i one value): :meth:`extras`."""

    down: int
    up: int

    @classmethod
    def of(cls, size: int, payload_more: int) -> DenseCost:
        """``payload_more`` values travel beside the model of ``size`` values."""
        return cls(FLOAT32_BYTES * (size + payload_more), FLOAT32_BYTES * size)

    @staticmethod
    def extras(tensors: Mapping[str, torch.Tensor]) -> int:
        """The float32 bytes of the tensors an update carried beside its delta."""
        return FLOAT32_BYTES * sum(t.numel() for t in tensors.values())

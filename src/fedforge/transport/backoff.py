"""A client's patience with a server that is busy, away or slow: a call that ends
in a transient status is tried again after a jittered, exponentially growing
pause (bounded), for a bounded time; what is not transient is raised at once."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

T = TypeVar("T")

# the server is overloaded (RESOURCE_EXHAUSTED), away or restarting (UNAVAILABLE),
# slow (DEADLINE_EXCEEDED), stopping or cutting a call off (CANCELLED, ABORTED)
TRANSIENT = frozenset(
    {
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
    }
)


@dataclass
class Backoff:
    """Pauses of ``first_s`` doubling up to ``cap_s``, each drawn uniformly from
    half to one and a half times its nominal length (so clients refused together
    do not come back together)."""

    first_s: float = 0.2
    cap_s: float = 5.0
    nominal_s: float = 0.0

    def pause(self) -> float:
        """The next pause's length, in seconds."""
        self.nominal_s = min(self.cap_s, self.nominal_s * 2 or self.first_s)
        return self.nominal_s * random.uniform(0.5, 1.5)

    def reset(self) -> None:
        self.nominal_s = 0.0


def retrying(
    call: Callable[[], T],
    for_s: float,
    on_retry: Callable[[grpc.RpcError, float], None] = lambda exc, pause: None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, tried again after each transient failure until ``for_s`` seconds
    have passed since the first try (then the last failure is raised)."""
    backoff = Backoff()
    end = time.monotonic() + for_s
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            pause = backoff.pause()
            if exc.code() not in TRANSIENT or time.monotonic() + pause > end:
                raise
            on_retry(exc, pause)
            sleep(pause)

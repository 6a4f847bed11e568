"""What an update's header says of itself, checked before the server counts it:
whose update it is, how many examples it weighs, the client's training loss, and
(asked for by ``communication.clip_multiple``) its delta's norm before the client's
clip."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fedforge.client.runtime import NORM_BEFORE_CLIP
from fedforge.core.errors import UploadError

# The largest num_examples taken: float64 holds every integer up to 2^53, so a
# weight, and a sum of a few of them, stays exact and finite.
MAX_EXAMPLES = 2**53


def read_update_header(
    meta: Mapping[str, Any], client_id: int, round_idx: int
) -> tuple[int, float]:
    """``(num_examples, train_loss)`` of an update that must be labelled
    ``client_id``, ``round_idx``; the loss is NaN when the client sent null (its
    own loss was not finite)."""
    if meta.get("client_id") != client_id or meta.get("round_idx") != round_idx:
        raise UploadError(
            f"update is labelled client_id {meta.get('client_id')!r:.40} round_idx "
            f"{meta.get('round_idx')!r:.40}; expected client_id {client_id} round_idx "
            f"{round_idx} (round {round_idx + 1})"
        )
    n = meta.get("num_examples")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_EXAMPLES:
        raise UploadError(f"num_examples {n!r:.60} must be an integer in [1, 2^53]")
    return n, _loss(meta.get("train_loss"))


def _finite(value: Any) -> float | None:
    """``value`` as a float if it is a finite JSON number (an int of 400 digits is
    one, but no float), else None."""
    if not isinstance(value, bool) and isinstance(value, int | float):
        x = float(value) if abs(value) < 2**1023 else math.inf
        if math.isfinite(x):
            return x
    return None


def _loss(value: Any) -> float:
    """A finite JSON number, or NaN for null."""
    if value is None:
        return math.nan
    if (loss := _finite(value)) is not None:
        return loss
    raise UploadError(f"train_loss {value!r:.60} must be a finite number, or null")


def read_norm_before_clip(meta: Mapping[str, Any]) -> float | None:
    """The L2 norm the client reports its delta had before its clip (None: it
    reports none). The server cannot recompute it from a clipped delta and takes
    it on trust, checked only to be a finite non-negative number: the clip bound
    is a multiple of the median of such norms (server/client_lr.py), which no
    minority of clients can move past the honest ones' range, however far off
    the numbers they send."""
    if NORM_BEFORE_CLIP not in meta:
        return None
    value = meta[NORM_BEFORE_CLIP]
    if (norm := _finite(value)) is not None and norm >= 0:
        return norm
    raise UploadError(f"{NORM_BEFORE_CLIP} {value!r:.60} must be a finite number >= 0")

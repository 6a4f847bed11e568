"""Norm bounding (Sun, Kairouz, Suresh, McMahan, "Can You Really Backdoor
Federated Learning?", 2019) and centred clipping (Karimireddy, He, Jaggi,
"Learning from History for Byzantine Robust Optimization", ICML 2021). Run on
the server over the gathered ``[K, P]`` updates; trust no update's size.

``NormBound``: every update is scaled to norm at most ``tau``, then averaged
with FedAvg's ``num_examples`` weights (it is FedAvg on bounded updates: the
defence is the bound; a client lying about its size still moves the model by at
most its weight times ``tau``).
``CentredClip``: starting from the previous round's aggregate v (zero at
first), ``iterations`` times v <- v + mean_k clip_tau(u_k - v), one vote each.

``tau`` is fixed (``bound``) or, with ``bound=None``, the median of the norms
(distances to v for centred clipping) seen in the last ``window`` rounds, this
round's included. Cross-round state (recent norms, previous aggregate) lives in
the aggregator object and goes into every checkpoint (``state_dict``), so a
resumed run continues it exactly.
"""

from __future__ import annotations

from collections import deque

import torch

from fedforge.aggregation.mean import Accumulator
from fedforge.core.errors import ConfigError
from fedforge.robust.common import RowStack, check_inputs
from fedforge.robust.geomed import distances_to


class _Bound:
    """A fixed bound, or the median of the norms of the last ``window`` rounds."""

    def __init__(self, bound: float | None, window: int) -> None:
        if bound is not None and not bound > 0:
            raise ConfigError(f"norm bound {bound!r} is invalid: must be > 0, or null (adaptive)")
        if window < 1:
            raise ConfigError(f"norm window {window!r} is invalid: must be an integer >= 1")
        self.bound = bound
        self.recent: deque[list[float]] = deque(maxlen=window)

    def tau(self, norms: torch.Tensor) -> float:
        if self.bound is not None:
            return self.bound
        self.recent.append([float(x) for x in norms])
        seen = torch.tensor([x for r in self.recent for x in r], dtype=torch.float64)
        tau = float(seen.median())  # the lower middle value for an even count
        return tau if tau > 0 else float("inf")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The recent norms as one float64 vector and the rounds' counts."""
        if self.bound is not None:
            return {}
        flat = [x for r in self.recent for x in r]
        return {
            "norms": torch.tensor(flat, dtype=torch.float64),
            "counts": torch.tensor([len(r) for r in self.recent], dtype=torch.int64),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.recent.clear()
        if self.bound is None and state:
            norms, counts = state["norms"].tolist(), state["counts"].tolist()
            if sum(counts) != len(norms) or len(counts) > (self.recent.maxlen or 0):
                raise ValueError(f"{len(counts)} rounds of {len(norms)} norms do not fit")
            at = 0
            for c in counts:
                self.recent.append(norms[at : at + c])
                at += c


def clip_factors(norms: torch.Tensor, tau: float) -> torch.Tensor:
    """min(1, tau / norm) per row (1 for a zero row)."""
    return (tau / norms.clamp(min=1e-300)).clamp(max=1.0)


class NormBound:
    """Clip each update to norm tau, then the num_examples-weighted mean."""

    name = "norm_bound"
    needs_individual = True
    linear = False

    def __init__(self, bound: float | None = None, window: int = 5) -> None:
        self._bound = _Bound(bound, window)

    def min_updates(self) -> int:
        return 1

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_inputs(updates, weights)
        norms = updates.norm(dim=1)
        scale = clip_factors(norms, self._bound.tau(norms)).to(updates.dtype)
        w = weights.to(updates.dtype)
        return ((w * scale) @ updates) / w.sum()

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return RowStack(self.aggregate)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._bound.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._bound.load_state_dict(state)


class CentredClip:
    """Centred clipping around the previous aggregate, ``iterations`` times."""

    name = "centred_clip"
    needs_individual = True
    linear = False

    def __init__(self, bound: float | None = None, window: int = 5, iterations: int = 1) -> None:
        if iterations < 1:
            raise ConfigError(f"centred clip iterations {iterations!r} must be an integer >= 1")
        self._bound = _Bound(bound, window)
        self.iterations = iterations
        self.centre: torch.Tensor | None = None

    def min_updates(self) -> int:
        return 1

    def aggregate(self, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_inputs(updates, weights)
        k, p = updates.shape
        v = torch.zeros(p, dtype=updates.dtype) if self.centre is None else self.centre.clone()
        tau = self._bound.tau(distances_to(updates, v))
        for _ in range(self.iterations):
            s = clip_factors(distances_to(updates, v), tau).to(updates.dtype)
            # v + mean_k s_k (u_k - v), without a [K, P] temporary
            v = v + (s @ updates - s.sum() * v) / k
        self.centre = v.clone()
        return v

    def start(self, size: int, dtype: torch.dtype) -> Accumulator:
        return RowStack(self.aggregate)

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {f"bound/{k}": v for k, v in self._bound.state_dict().items()}
        if self.centre is not None:
            state["centre"] = self.centre.clone()
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        bound = {k.removeprefix("bound/"): v for k, v in state.items() if k.startswith("bound/")}
        self._bound.load_state_dict(bound)
        centre = state.get("centre")
        self.centre = centre.clone() if centre is not None else None

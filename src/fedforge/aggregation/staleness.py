"""How much a stale update weighs in buffered asynchronous aggregation.

An update's staleness s is the number of server steps between the model its
client trained from and the model it is applied to. FedAsync (Xie et al. 2019,
section 5.2) scales a stale update by s(t - tau): constant 1, polynomial
(1 + s)^-a, or a hinge that keeps 1 up to b steps and then falls as
1 / (a (s - b) + 1); FedBuff (Nguyen et al. 2022) uses the polynomial with
a = 0.5, 1 / sqrt(1 + s). Pure arithmetic on the server, shared by the
simulator's buffer and any other driver of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.config.asynchronous import AsynchronousConfig


@dataclass(frozen=True)
class StalenessWeight:
    """s(staleness) of one rule; ``max_staleness``: past it an update is refused."""

    kind: str  # constant | polynomial | hinge
    exponent: float = 0.5  # polynomial: a
    slope: float = 10.0  # hinge: a
    after: int = 4  # hinge: b
    max_staleness: int | None = None

    @classmethod
    def of(cls, cfg: AsynchronousConfig) -> StalenessWeight:
        return cls(
            cfg.staleness,
            cfg.staleness_exponent,
            cfg.hinge_slope,
            cfg.hinge_after,
            cfg.max_staleness,
        )

    def __call__(self, staleness: int) -> float:
        if staleness < 0:
            raise ValueError(f"staleness {staleness} < 0")
        if self.kind == "polynomial":
            return float((1.0 + staleness) ** -self.exponent)
        if self.kind == "hinge":
            if staleness <= self.after:
                return 1.0
            return 1.0 / (self.slope * (staleness - self.after) + 1.0)
        return 1.0

    def refusal(self, staleness: int) -> str | None:
        """Why an update this stale is refused, or None."""
        if self.max_staleness is not None and staleness > self.max_staleness:
            return (
                f"it is {staleness} server steps stale, more than "
                f"asynchronous.max_staleness = {self.max_staleness}"
            )
        return None


__all__ = ["StalenessWeight"]

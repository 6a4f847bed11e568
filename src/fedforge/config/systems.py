"""The ``systems:`` config section: each client's device and network profile
(systems/profile.py), which the simulator's virtual clock reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SystemsConfig:
    """Where the clients' system profiles come from (none: no virtual clock,
    every client equally fast and always online)."""

    # a CSV of one profile per client (systems/profile.py's columns), e.g. one
    # `fedforge profile` wrote from a deployment; null: no profiles
    profiles: str | None = None

    @property
    def enabled(self) -> bool:
        return self.profiles is not None

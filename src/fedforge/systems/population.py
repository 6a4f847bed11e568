"""A run's population of system profiles, from its ``systems:`` section."""

from __future__ import annotations

from pathlib import Path

from fedforge.config import Config
from fedforge.systems.profile import ClientProfile, read_profiles


def population(cfg: Config) -> list[ClientProfile] | None:
    """Every client's profile by id (None: the run has no profiles). A relative
    ``systems.profiles`` path is taken from the working directory."""
    if cfg.systems.profiles is None:
        return None
    return read_profiles(Path(cfg.systems.profiles), cfg.num_clients)


__all__ = ["population"]

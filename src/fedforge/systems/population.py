"""A run's population of system profiles and their availability, from its
``systems:`` section: a CSV of per-client values (``systems.profiles``) or
draws from the section's distributions (``systems.draw``: systems/draw.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedforge.config import Config
from fedforge.systems.availability import Availability
from fedforge.systems.draw import draw_profiles
from fedforge.systems.profile import ClientProfile, read_profiles
from fedforge.systems.trace import read_trace


def population(cfg: Config) -> list[ClientProfile] | None:
    """Every client's profile by id (None: the run has no profiles). A relative
    ``systems.profiles`` path is taken from the working directory."""
    systems = cfg.systems
    if systems.draw:
        return draw_profiles(systems, cfg.seed, cfg.num_clients)
    if systems.profiles is None:
        return None
    return read_profiles(Path(systems.profiles), cfg.num_clients)


@dataclass
class Systems:
    """What the virtual clock reads: the profiles, when each client is online,
    and the round's rules (deadline, over-selection)."""

    profiles: list[ClientProfile]
    availability: Availability
    deadline_s: float | None = None
    over_selection: float = 0.0


def systems_of(cfg: Config) -> Systems | None:
    """The run's :class:`Systems` (None: no ``systems:`` profiles, no clock)."""
    profiles = population(cfg)
    if profiles is None:
        return None
    s = cfg.systems
    trace = read_trace(Path(s.trace), cfg.num_clients) if s.trace is not None else None
    avail = Availability(cfg.seed, profiles, s.daily_hours, trace)
    return Systems(profiles, avail, s.deadline_s, s.over_selection)


__all__ = ["Systems", "population", "systems_of"]

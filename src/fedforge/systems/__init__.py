"""Systems heterogeneity: what each client's device and network are like
(profiles), when it can be reached (availability) and how long its work takes
on the simulator's virtual clock."""

from fedforge.systems.availability import Availability
from fedforge.systems.clock import ClientTime, client_time
from fedforge.systems.population import Systems, population, systems_of
from fedforge.systems.profile import COLUMNS, ClientProfile, read_profiles, write_profiles

__all__ = [
    "COLUMNS",
    "Availability",
    "ClientProfile",
    "ClientTime",
    "Systems",
    "client_time",
    "population",
    "read_profiles",
    "systems_of",
    "write_profiles",
]

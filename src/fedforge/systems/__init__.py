"""Systems heterogeneity: what each client's device and network are like
(profiles), when it can be reached (availability) and how long its work takes
on the simulator's virtual clock."""

from fedforge.systems.profile import COLUMNS, ClientProfile, read_profiles, write_profiles

__all__ = ["COLUMNS", "ClientProfile", "read_profiles", "write_profiles"]

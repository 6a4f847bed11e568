"""A population of system profiles drawn from the ``systems:`` section's
distributions (config/systems.py), from the run's seed alone: every engine, a
rerun and a resumed run draw the same population.

Compute speed is lognormal: median ``compute_median``, log standard deviation
``compute_sigma``. Each client falls in one bandwidth class with probability
its weight, then draws its download and upload bandwidth, independently,
lognormal around that class's medians (``bandwidth_sigma``); latency is
lognormal too. The availability spells and the failure probability are the
section's, the same for every client (the on/off process itself differs per
client: systems/availability.py).
"""

from __future__ import annotations

import numpy as np

from fedforge.config.systems import SystemsConfig
from fedforge.core.rng import numpy_rng
from fedforge.systems.profile import ClientProfile


def lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    """``n`` draws of median ``median`` and log standard deviation ``sigma``."""
    return median * np.exp(sigma * rng.standard_normal(n))


def draw_profiles(systems: SystemsConfig, seed: int, num_clients: int) -> list[ClientProfile]:
    """Every client's profile by id, drawn from (seed, purpose)."""
    rng = numpy_rng(seed, "systems", "profiles")
    n = num_clients
    compute = lognormal(rng, systems.compute_median, systems.compute_sigma, n)
    weights = np.asarray(systems.bandwidth_weights, dtype=np.float64)
    klass = rng.choice(len(weights), size=n, p=weights / weights.sum())
    down = np.asarray(systems.download_median_bps)[klass]
    up = np.asarray(systems.upload_median_bps)[klass]
    down = down * np.exp(systems.bandwidth_sigma * rng.standard_normal(n))
    up = up * np.exp(systems.bandwidth_sigma * rng.standard_normal(n))
    latency = lognormal(rng, systems.latency_median_s, systems.latency_sigma, n)
    return [
        ClientProfile(
            client_id=c,
            samples_per_s=float(compute[c]),
            download_bps=float(down[c]),
            upload_bps=float(up[c]),
            latency_s=float(latency[c]),
            failure_prob=systems.failure_prob,
            mean_online_s=systems.mean_online_s,
            mean_offline_s=systems.mean_offline_s,
        )
        for c in range(n)
    ]


__all__ = ["draw_profiles", "lognormal"]

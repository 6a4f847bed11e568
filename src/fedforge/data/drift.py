"""A drift schedule: the labels a client trains on, and the test set is read
with, as a function of the round (config/drift.py says what the fields mean).

``kind: label_map``: round r is in phase floor(r / every), and phase p reads
every label y as ``maps[p mod groups][y]``. The maps are those of a concept
shift (data/concept.py: row 0 the identity, the others distinct derangements),
drawn from their own stream (seed, "drift", g), so a run with both a concept
shift and a drift has two independent sets of maps. Everything is a function of
the seed and the round index: a resumed run reads the labels its uninterrupted
twin read, and every engine (serial, vectorised, pool, Ray) maps the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedforge.config.drift import DriftConfig
from fedforge.data.concept import label_maps


@dataclass(frozen=True)
class DriftSchedule:
    """The label maps ``[groups, C]`` and the rounds a phase lasts."""

    maps: torch.Tensor
    every: int

    def phase(self, round_idx: int) -> int:
        """The phase round ``round_idx`` (from 0) is in."""
        return round_idx // self.every

    def map_index(self, round_idx: int) -> int:
        """The row of ``maps`` round ``round_idx`` reads its labels through."""
        return self.phase(round_idx) % len(self.maps)

    def labels(self, y: torch.Tensor, round_idx: int) -> torch.Tensor:
        """``y`` as round ``round_idx`` sees it (``y`` itself in an identity phase)."""
        g = self.map_index(round_idx)
        if g == 0:
            return y
        return self.maps[g].to(y.device)[y.long()].to(y.dtype)


def schedule_of(drift: DriftConfig, num_classes: int, seed: int) -> DriftSchedule | None:
    """The run's schedule (None: no drift)."""
    if not drift.on:
        return None
    maps = label_maps(drift.groups, num_classes, seed, stream="drift")
    return DriftSchedule(torch.from_numpy(maps), drift.every)

"""A drift schedule: the rows a client trains on, and the test rows the model
is scored on, as a function of the round (config/drift.py says what the
fields mean). Round r is in phase floor(r / every); phase p is in group
p mod groups.

- ``label_map``: group g reads every label y as ``maps[g][y]``. The maps are
  those of a concept shift (data/concept.py: row 0 the identity, the others
  distinct derangements), drawn from their own stream (seed, "drift", g), so a
  run with both a concept shift and a drift has two independent sets of maps.
- ``label_mix``: group g draws a class with weight ``weights[g][c]``
  (``strength`` for the group's classes, 1 for the others; the classes dealt
  over the groups by a permutation from (seed, "drift-mix")). A client's rows
  are redrawn each phase, as many as it holds, with replacement, from
  (seed, "drift-mix", phase, client); the test set's from (seed,
  "drift-mix", phase, "test").

Everything is a function of the seed, the round and the client: a resumed run
reads the rows its uninterrupted twin read, and every engine (serial,
vectorised, pool, Ray) reads the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedforge.config.drift import DriftConfig
from fedforge.core.rng import numpy_rng, torch_generator
from fedforge.data.concept import label_maps

Rows = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class DriftSchedule:
    """The rounds a phase lasts and, per group, a label map (``label_map``) or
    class weights (``label_mix``), ``[groups, C]`` either way."""

    kind: str
    every: int
    table: torch.Tensor
    seed: int = 0

    def phase(self, round_idx: int) -> int:
        """The phase round ``round_idx`` (from 0) is in."""
        return round_idx // self.every

    def group(self, round_idx: int) -> int:
        """The row of ``table`` round ``round_idx`` reads."""
        return self.phase(round_idx) % len(self.table)

    def labels(self, y: torch.Tensor, round_idx: int) -> torch.Tensor:
        """``label_map``: ``y`` as round ``round_idx`` reads it (``y`` itself in an
        identity phase)."""
        g = self.group(round_idx)
        if g == 0:
            return y
        return self.table[g].to(y.device)[y.long()].to(y.dtype)

    def draw(self, y: torch.Tensor, round_idx: int, *keys: int | str) -> torch.Tensor:
        """``label_mix``: the indices into ``y`` of the phase's redrawn rows, as
        many as ``y`` has, a class drawn by the group's weight (``keys`` name
        the rows' owner: a client id, or "test")."""
        weights = self.table[self.group(round_idx)][y.long().cpu()]
        gen = torch_generator(self.seed, "drift-mix", self.phase(round_idx), *keys)
        return torch.multinomial(weights, len(y), replacement=True, generator=gen)

    def client_rows(self, x: torch.Tensor, y: torch.Tensor, round_idx: int, client: int) -> Rows:
        """The rows client ``client`` trains on in round ``round_idx``."""
        return self._rows(x, y, round_idx, client)

    def test_rows(self, x: torch.Tensor, y: torch.Tensor, round_idx: int) -> Rows:
        """The test rows the model after round ``round_idx`` is scored on."""
        return self._rows(x, y, round_idx, "test")

    def _rows(self, x: torch.Tensor, y: torch.Tensor, round_idx: int, key: int | str) -> Rows:
        if self.kind == "label_map":
            return x, self.labels(y, round_idx)
        if len(y) == 0:
            return x, y
        idx = self.draw(y, round_idx, key).to(y.device)
        return x[idx], y[idx]


def class_weights(groups: int, num_classes: int, strength: float, seed: int) -> torch.Tensor:
    """``[groups, C]``: group g's weight of each class, ``strength`` for the classes
    dealt to it (a permutation of the classes from (seed, "drift-mix") cut in
    turn over the groups), 1 for the others."""
    order = numpy_rng(seed, "drift-mix").permutation(num_classes)
    table = torch.ones(groups, num_classes, dtype=torch.float64)
    for rank, c in enumerate(order.tolist()):
        table[rank % groups, c] = strength
    return table


def schedule_of(drift: DriftConfig, num_classes: int, seed: int) -> DriftSchedule | None:
    """The run's schedule (None: no drift)."""
    if not drift.on:
        return None
    if drift.kind == "label_mix":
        weights = class_weights(drift.groups, num_classes, drift.strength, seed)
        return DriftSchedule(drift.kind, drift.every, weights, seed)
    maps = label_maps(drift.groups, num_classes, seed, stream="drift")
    return DriftSchedule(drift.kind, drift.every, torch.from_numpy(maps), seed)

"""Engines decide where client work runs, never what it computes (DESIGN idea 4)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from fedforge.client import ClientTask, ClientUpload


class Engine(Protocol):
    """Runs a cohort's tasks against one payload and yields their uploads."""

    name: str

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]: ...


__all__ = ["Engine"]

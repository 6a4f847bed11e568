"""The ``pipeline`` section: pipeline stages a run adds by name (registered with
``fedforge.register_stage``), and where each list goes in the round.

- ``client``: client stages, in the order given, right after local training
  (and FedNova's rescaling), before the built-in clip, DP noise, simulated
  attacks and the uplink codec: whatever they make of an update is then clipped,
  noised and encoded as any update is.
- ``server``: server stages, each placed by its own ``where``: ``server_upload``
  (each decoded update, in the order given), ``server_cohort`` (the cohort's rows,
  after the robust gates and before the report weights) or ``server_aggregate``
  (the aggregate, after central DP noise, before the server step).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.core.builtins import PLACED_BY
from fedforge.core.errors import invalid_field

StageName = str  # a registered stage (fedforge.register_stage)
MetricName = str  # a registered metric (fedforge.register_metric)


def no_repeats(field: str, names: tuple[str, ...]) -> None:
    """Refuse a name given twice in the list ``field`` (a stage runs once a round;
    a metric is one column)."""
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise invalid_field(field, list(names), f"names {', '.join(twice)} more than once")


def not_placed_by_a_section(field: str, names: tuple[str, ...]) -> None:
    """Refuse a built-in stage that its section places (``clip`` by
    ``communication.clip_norm``): the section's field says where and how."""
    for name in names:
        if name in PLACED_BY:
            raise invalid_field(
                field, list(names), f"{name!r} is placed by {PLACED_BY[name]}: set that instead"
            )


@dataclass(frozen=True)
class PipelineConfig:
    """Named stages added to the round (see the module docstring for where)."""

    client: tuple[StageName, ...] = ()
    server: tuple[StageName, ...] = ()

    def check(self) -> None:
        no_repeats("pipeline.client", self.client)
        no_repeats("pipeline.server", self.server)
        not_placed_by_a_section("pipeline.client", self.client)
        not_placed_by_a_section("pipeline.server", self.server)

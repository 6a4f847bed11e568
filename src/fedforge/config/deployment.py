"""The ``deployment:`` section: how a ``fedforge server`` waits for its clients
and closes its rounds. The simulator ignores it (every client answers there).

A round is open until every asked client answered, ``target`` answers were
accepted under over-selection, or ``round_deadline_s`` passed; clients that
did not answer by then are dropouts. Production systems over-select (Bonawitz et
al. 2019, "Towards federated learning at scale"): the server samples a
fraction ``client_fraction * (1 + over_selection)`` of the clients (at most all)
for the K = max(1, C N) it needs and closes the round at K updates, so a few
slow or vanished devices do not hold it up.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.core.errors import raise_first


@dataclass(frozen=True)
class DeploymentConfig:
    """The deployment server's waiting rules (transport/)."""

    # clients that must have joined before round 1 starts (null: every client
    # of the run, num_clients)
    start_clients: int | None = None
    start_timeout_s: float = 600.0  # give up waiting for them after this long
    round_deadline_s: float = 300.0  # a phase's answers are awaited this long at most
    over_selection: float = 0.0  # ask this fraction more clients than the round needs
    # seconds without a poll after which a client counts as gone (a dropout)
    heartbeat_timeout_s: float = 30.0
    max_message_mib: float = 256.0  # larger uploads are refused before they are read
    chunk_kib: int = 1024  # the size of the chunks payloads are streamed in
    # a client that joins first evaluates the current model on its own data, and
    # trains only once it has reported (the run records new clients' scores)
    cold_start: bool = True
    # model versions and canary rollout: every canary_every rounds the global
    # model is a version of the store, a candidate evaluated by canary_fraction of
    # the clients beside the serving one and promoted unless its canary_metric is
    # worse by more than canary_max_drop (0: no versions, no canary)
    canary_every: int = 0
    canary_fraction: float = 0.1
    canary_metric: str = "accuracy"  # accuracy (higher is better) or loss
    canary_max_drop: float = 0.01
    canary_min_reports: int = 3

    def check(self) -> None:
        raise_first(
            "deployment.",
            [
                (
                    "start_clients",
                    self.start_clients,
                    self.start_clients is None or self.start_clients >= 1,
                    "must be an integer >= 1, or null (every client of the run)",
                ),
                ("start_timeout_s", self.start_timeout_s, self.start_timeout_s > 0, "must be > 0"),
                (
                    "round_deadline_s",
                    self.round_deadline_s,
                    self.round_deadline_s > 0,
                    "must be a number of seconds > 0",
                ),
                (
                    "over_selection",
                    self.over_selection,
                    0.0 <= self.over_selection <= 10.0,
                    "must be in [0, 10] (0: ask exactly the clients the round needs)",
                ),
                (
                    "heartbeat_timeout_s",
                    self.heartbeat_timeout_s,
                    self.heartbeat_timeout_s > 0,
                    "must be a number of seconds > 0",
                ),
                (
                    "max_message_mib",
                    self.max_message_mib,
                    0 < self.max_message_mib <= 2047,
                    "must be in (0, 2047] (gRPC's limit is 2 GiB)",
                ),
                ("chunk_kib", self.chunk_kib, 1 <= self.chunk_kib <= 4096, "must be in [1, 4096]"),
                (
                    "canary_every",
                    self.canary_every,
                    self.canary_every >= 0,
                    "must be an integer >= 0 (0: no canary rollout)",
                ),
                (
                    "canary_fraction",
                    self.canary_fraction,
                    0.0 < self.canary_fraction <= 1.0,
                    "must be in (0, 1]",
                ),
                (
                    "canary_metric",
                    self.canary_metric,
                    self.canary_metric in ("accuracy", "loss"),
                    "must be 'accuracy' or 'loss'",
                ),
                (
                    "canary_max_drop",
                    self.canary_max_drop,
                    self.canary_max_drop >= 0,
                    "must be >= 0",
                ),
                (
                    "canary_min_reports",
                    self.canary_min_reports,
                    self.canary_min_reports >= 1,
                    "must be an integer >= 1",
                ),
            ],
        )

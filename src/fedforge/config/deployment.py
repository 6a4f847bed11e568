"""The ``deployment:`` section: how a ``fedforge server`` waits for its clients
and closes its rounds. The simulator ignores it (every client answers there).

A round is open until every asked client answered, ``target`` answers were
accepted under over-selection, or ``round_deadline_s`` passed; clients that
did not answer by then are dropouts. Production systems over-select (Bonawitz et
al. 2019, "Towards federated learning at scale"): the server samples a
fraction ``client_fraction * (1 + over_selection)`` of the clients (at most all)
for the K = max(1, C N) it needs and closes the round at K updates, so a few
slow or vanished devices do not hold it up.

``client_data``: where the clients' examples are. ``partition`` (the default):
the simulator's partition of the config's data set, which the server loads too
and each ``fedforge client --clients IDS`` trains its ids' part of. ``remote``:
each ``fedforge client --data PATH --client-id N`` brings its own examples; the
server loads the test set alone (it evaluates on it), takes the clients' sizes
from their joins, and refuses what needs the clients' data on the server
(:func:`remote_data_fits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_CLIENTS, MAX_ROUNDS
from fedforge.config.communication import CommunicationConfig
from fedforge.config.data import PartitionConfig
from fedforge.config.evaluation import DiagnosticsConfig
from fedforge.config.privacy import PrivacyConfig
from fedforge.config.ranges import Most, Range
from fedforge.config.robust import RobustConfig
from fedforge.core.errors import ConfigError, raise_first

ClientData = Literal["partition", "remote"]


@dataclass(frozen=True)
class DeploymentConfig:
    """The deployment server's waiting rules (transport/)."""

    # clients that must have joined before round 1 starts (null: every client
    # of the run, num_clients)
    start_clients: Annotated[
        int | None, Range(">= 1", null="every client of the run"), Most(MAX_CLIENTS, "clients")
    ] = None
    # give up waiting for them after this long
    start_timeout_s: Annotated[float, Range("> 0", note="seconds")] = 600.0
    # a phase's answers are awaited this long at most
    round_deadline_s: Annotated[float, Range("> 0", note="seconds")] = 300.0
    # ask this fraction more clients than the round needs
    over_selection: Annotated[
        float, Range("[0, 10]", note="0: ask exactly the clients the round needs")
    ] = 0.0
    # seconds without a poll after which a client counts as gone (a dropout)
    heartbeat_timeout_s: Annotated[float, Range("> 0", note="seconds")] = 30.0
    # larger uploads are refused before they are read; one client name's uploads
    # being read at once declare this much together at most (the next waits for
    # room, up to round_deadline_s)
    max_message_mib: Annotated[float, Range("(0, 2047]", note="gRPC's limit is 2 GiB")] = 256.0
    # the size of the chunks payloads are streamed in
    chunk_kib: Annotated[int, Range("[1, 4096]"), Most(4096, "KiB")] = 1024
    # calls whose request has not arrived (their sender not yet known) one peer
    # address may hold, and the server over all addresses: a call past either is
    # answered RESOURCE_EXHAUSTED at once. Each may hold up to 4 MiB + 64 KiB (or
    # chunk_kib + 64 KiB if larger), so the defaults bound what unauthenticated
    # peers make the server hold to 520 MiB, 130 MiB from one address
    # (transport/admission.py)
    pending_per_address: Annotated[int, Most(4096, "calls waiting for their request", least=1)] = 32
    pending_calls: Annotated[
        int, Range(">= 1"), Most(4096, "calls waiting for their request: 16 GiB")
    ] = 128
    # a round samples the clients whose process is there (transport/presence.py);
    # with fewer live than robust.min_clients it waits this long for them, then is
    # skipped with the reason (0: skipped at once)
    live_wait_s: Annotated[
        float, Range("[0, 86400]", note="seconds; 0: skip a short round at once")
    ] = 60.0
    # a client that joins first evaluates the current model on its own data, and
    # trains only once it has reported (the run records new clients' scores in
    # the store's cold_start table; its downloads are evaluation traffic, not the
    # rounds' bytes). Off by default: it costs every client a model download, and
    # its reports tell the server a client's own numbers (refused with secure
    # aggregation, local or distributed DP)
    cold_start: bool = False
    # model versions and canary rollout: every canary_every rounds the global
    # model is a version of the store, a candidate evaluated by canary_fraction of
    # the clients beside the serving one and promoted unless its canary_metric is
    # worse by more than canary_max_drop (0: no versions, no canary)
    canary_every: Annotated[
        int, Range(">= 0", note="0: no canary rollout"), Most(MAX_ROUNDS, "rounds")
    ] = 0
    canary_fraction: Annotated[float, Range("(0, 1]")] = 0.1
    canary_metric: str = "accuracy"  # accuracy (higher is better) or loss
    canary_max_drop: Annotated[float, Range(">= 0")] = 0.01
    canary_min_reports: Annotated[int, Range(">= 1"), Most(MAX_CLIENTS, "clients")] = 3
    client_data: ClientData = "partition"  # the simulator's partition, or the clients' own
    # calls the server holds waiting at once (long polls, heartbeats held open:
    # a client process holds one or two); past it a poll is told to come back
    # later (RESOURCE_EXHAUSTED). Each costs a coroutine, not a thread
    max_waiting_calls: Annotated[
        int, Range(">= 1"), Most(2 * MAX_CLIENTS, "waiting calls: two a client")
    ] = 20_000

    def check(self) -> None:
        raise_first(
            "deployment.",
            [
                (
                    "client_data",
                    self.client_data,
                    self.client_data in ("partition", "remote"),
                    "must be 'partition' (the simulator's) or 'remote' (the clients' own)",
                ),
                (
                    "pending_per_address",
                    self.pending_per_address,
                    1 <= self.pending_per_address <= self.pending_calls,
                    f"must be an integer in [1, pending_calls = {self.pending_calls}]",
                ),
                (
                    "canary_metric",
                    self.canary_metric,
                    self.canary_metric in ("accuracy", "loss"),
                    "must be 'accuracy' or 'loss'",
                ),
            ],
        )


def remote_data_fits(
    deployment: DeploymentConfig,
    partition: PartitionConfig,
    eval_clients: bool,
    diagnostics: DiagnosticsConfig,
    robust: RobustConfig,
    communication: CommunicationConfig,
    privacy: PrivacyConfig,
) -> None:
    """With ``client_data: remote`` the server holds no client's examples, and
    the clients' data is theirs: refuse what reads a client's rows on the server
    (each client's held-out slice scored, the global model's loss on the
    cohort's data), simulates them (feature shift, label noise, attackers, edge
    groups by majority label), or needs every client's example count when the
    server is built, before any joined (central DP's capped weights)."""
    if deployment.client_data != "remote":
        return
    server_reads = "the server would evaluate on its clients' rows"
    rules = [
        ("evaluation.clients", eval_clients, eval_clients, server_reads, "false"),
        ("diagnostics.loss_gap", diagnostics.loss_gap, diagnostics.loss_gap, server_reads, "false"),
        (
            "partition.feature_shift",
            list(partition.feature_shift),
            bool(partition.feature_shift),
            "it simulates the clients' features",
            "[]",
        ),
        (
            "partition.label_noise",
            partition.label_noise,
            partition.label_noise > 0,
            "it simulates the clients' labels",
            "0",
        ),
        (
            "partition.concept_shift",
            partition.concept_shift,
            partition.concept_shift > 0,
            "it simulates the clients' labels",
            "0",
        ),
        (
            "robust.attack",
            robust.attack,
            robust.attack != "none",
            "its attackers are simulated clients",
            "'none'",
        ),
        (
            "communication.group_by",
            communication.group_by,
            bool(communication.groups) and communication.group_by == "label",
            "the server would read its clients' labels",
            "'contiguous'",
        ),
        (
            "privacy.weights",
            privacy.weights,
            privacy.dp == "central" and privacy.weights == "capped",
            "central DP's noise is scaled by the cohort's expected weight, a sum over every "
            "client's example count, which the server does not know when it starts",
            "'uniform'",
        ),
    ]
    for name, value, refused, why, fix in rules:
        if refused:
            raise ConfigError(
                f"{name} = {value!r} cannot run with deployment.client_data = 'remote' (the "
                f"clients bring their own data and the server holds none): {why}; set it to {fix}"
            )

"""The deployment server's Prometheus metrics, served over HTTP when asked
(``--metrics-port``): connected clients, the round's phase, answers accepted
and refused (by reason), bytes each way, and round time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from fedforge.core.errors import ConfigError
from fedforge.report.reasons import refusal_label
from fedforge.transport.hub import Hub


class _HubState:
    """Reads the hub at scrape time."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Any]:
        hub = self.hub
        yield GaugeMetricFamily(
            "fedforge_connected_clients",
            "clients heard from within the heartbeat timeout",
            value=len(hub.alive()),
        )
        yield GaugeMetricFamily(
            "fedforge_joined_clients", "client ids joined", value=len(hub.members)
        )
        yield InfoMetricFamily(
            "fedforge_round_phase", "what the server awaits", value={"phase": hub.phase}
        )
        moved = CounterMetricFamily(
            "fedforge_bytes", "payload bytes on the wire", labels=["direction"]
        )
        moved.add_metric(["down"], hub.bytes_down)
        moved.add_metric(["up"], hub.bytes_up)
        moved.add_metric(["messages_down"], hub.message_bytes_down)  # secure aggregation's
        moved.add_metric(["eval_down"], hub.eval_bytes_down)
        moved.add_metric(["eval_up"], hub.eval_bytes_up)
        yield moved
        yield CounterMetricFamily("fedforge_answers_accepted", "answers taken", value=hub.accepted)
        yield CounterMetricFamily(
            "fedforge_dropouts", "questions unanswered when their round closed", value=hub.dropouts
        )


class ServerMetrics:
    """The registry and, with a port, its HTTP endpoint."""

    def __init__(self, port: int | None) -> None:
        self.registry = CollectorRegistry()
        self.port = port
        self.refusals = Counter(
            "fedforge_refused", "requests and answers refused", ["reason"], registry=self.registry
        )
        self.round_seconds = Histogram(
            "fedforge_round_seconds",
            "a round's wall time",
            registry=self.registry,
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
        )
        self._server: Any = None

    def watch(self, hub: Hub) -> None:
        self.registry.register(_HubState(hub))
        if self.port is not None:
            try:
                self._server, _ = start_http_server(
                    self.port, addr="127.0.0.1", registry=self.registry
                )
            except OSError as exc:
                raise ConfigError(
                    f"--metrics-port {self.port}: cannot listen ({exc.strerror})"
                ) from None

    def refused(self, reason: str) -> None:
        self.refusals.labels(refusal_label(reason)).inc()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()

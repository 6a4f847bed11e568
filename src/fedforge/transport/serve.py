"""``fedforge server``: a federation from a config, as the simulator runs it (the
same loop, algorithms, stages, store and stops), with the clients in other
processes. It listens, waits for ``deployment.start_clients`` to join, runs the
rounds through the network engine (``remote.py``), and at the end tells the
clients the run is over. ``--resume RUN`` continues a run from its run store
after a crash; the clients reconnect by themselves.

With ``deployment.client_data: remote`` the clients bring their own examples:
the server loads the task's test set alone (``tasks.load_server_data``), tells
the clients its spec in Hello, and takes their sizes from their joins.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedforge.config import Config, override
from fedforge.config.alerts import AlertsConfig
from fedforge.config.components import check_names
from fedforge.config.parse import dump
from fedforge.config.privacy import check_served_noise, served_noise_warning, served_privacy
from fedforge.core.errors import ConfigError
from fedforge.data.federated import FederatedData
from fedforge.server.builtin_hooks import run_hooks
from fedforge.server.hooks import RoundHooks
from fedforge.server.loop import RunResult, resume, run
from fedforge.store import RunStore
from fedforge.tasks import check_known, load_server_data
from fedforge.transport import admission as adm
from fedforge.transport.admission import Admission
from fedforge.transport.buffered_remote import BufferedRemoteEngine
from fedforge.transport.hub import Hub
from fedforge.transport.joins import wait_for_joins
from fedforge.transport.live import LivePublisher
from fedforge.transport.logs import log_event, quiet_peer_gone
from fedforge.transport.loop_thread import LoopThread
from fedforge.transport.metrics import ServerMetrics
from fedforge.transport.plugins import run_plugins
from fedforge.transport.port_check import taken
from fedforge.transport.refusal_log import RefusalLog
from fedforge.transport.remote import RemoteEngine
from fedforge.transport.rollout import Rollout
from fedforge.transport.security import ServerSecurity
from fedforge.transport.service import SERVICE, FederationService

# threads for the hub's work of authenticated calls: short steps under its lock,
# an upload's digest and its wait for the round's verdict; a long poll or a held
# heartbeat waits on the event loop and holds none between its steps
# (``waits.py``), nor does a call still waiting for its request (``admission.py``)
MAX_WORKERS = 256


@dataclass(frozen=True)
class ServerOptions:
    security: ServerSecurity
    host: str = "127.0.0.1"
    port: int = 50051  # 0: any free port (said in the "listening" log line)
    metrics_port: int | None = None  # Prometheus metrics over HTTP; None: off
    progress: bool = False


class Deployment:
    """A listening server around a hub; ``run`` or ``resume`` drive the rounds."""

    def __init__(self, cfg: Config, options: ServerOptions) -> None:
        self.cfg, self.opt = cfg, options
        # every name the config gives is registered (a plugin's options parse), its
        # task and model known: refused here, not by each client after it joined
        check_names(cfg)
        check_known(cfg)
        dep = cfg.deployment
        # the clients bring their own data: the server holds the test set alone
        self.data: FederatedData | None = None
        if dep.client_data == "remote":
            self.data = load_server_data(cfg)
        self.metrics = ServerMetrics(options.metrics_port)
        self.hub = Hub(
            cfg.num_clients,
            dep.heartbeat_timeout_s,
            on_refusal=self._refused,
            allowed=options.security.members(),
            # a round that judges its updates together answers them at its end
            verdict_wait_s=dep.round_deadline_s,
        )
        self.heartbeat_timeout_s = dep.heartbeat_timeout_s
        max_bytes = int(dep.max_message_mib * (1 << 20))
        self.pool = futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="hub")
        self.admission = Admission(
            self._count,
            RefusalLog(self._say_refused),
            silence_s=dep.heartbeat_timeout_s,
            pending_per_address=dep.pending_per_address,
            pending_calls=dep.pending_calls,
            upload_bytes_per_name=max_bytes,
        )
        self.service = FederationService(
            self.hub,
            options.security.guard(),
            cfg.name,
            dump(dataclasses.replace(cfg, alerts=AlertsConfig())),  # the server's own hooks
            max_bytes,
            dep.chunk_kib * 1024,
            self.admission,
            self.pool,
            self.data.spec().to_json() if self.data is not None else "",
            max_waiting=dep.max_waiting_calls,
            plugins=run_plugins(cfg),
        )
        # no message larger than a few MiB is read before its sender is known: a
        # larger upload comes in chunks after its signed header
        request_bytes = adm.request_bytes(dep.chunk_kib * 1024)
        quiet_peer_gone()  # a client that cancels a download is no server error
        self.loop = LoopThread("grpc-server")
        self.port = self.loop.run(self._listen(request_bytes, max_bytes))
        if self.port == 0:
            self.loop.close()
            address = f"{options.host}:{options.port}"
            raise ConfigError(f"cannot listen on {address} (in use, or not an address here)")
        # the dashboard's view, in the run's folder once the run's store is open
        self.live = LivePublisher(self.hub, f"{options.host}:{self.port}")
        self.hub.on_change = self.live.changed
        # buffered asynchronous aggregation hands work out as clients become free
        engine = BufferedRemoteEngine if cfg.asynchronous.buffered else RemoteEngine
        self.engine = engine(
            self.hub, cfg, self.metrics.round_seconds.observe, on_store=self.live.bind
        )
        self.rollout = Rollout(self.hub, cfg)  # cold start, canary, the serving version

    def hooks(self) -> RoundHooks:
        """The run's round hooks: the built-in ones with the rollout among them (the
        round's gate: only cold-started clients are asked)."""
        return run_hooks(gates=[self.rollout])

    async def _listen(self, request_bytes: int, max_bytes: int) -> int:
        """Build the server on the loop, listening: its port (0: cannot listen)."""
        self.grpc = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", request_bytes),
                ("grpc.max_send_message_length", max_bytes),
                ("grpc.max_concurrent_streams", adm.STREAMS_PER_CONNECTION),
                ("grpc.server_handshake_timeout_ms", int(adm.HANDSHAKE_S * 1000)),
                # a second server on a port in use fails to listen, rather than
                # sharing it (gRPC's default SO_REUSEPORT splits the clients)
                ("grpc.so_reuseport", 0),
            ],
        )
        self.grpc.add_generic_rpc_handlers((self.service.handler(),))
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        address = f"{self.opt.host}:{self.opt.port}"
        if taken(self.opt.host, self.opt.port):  # on any address the host names
            return 0
        creds = self.opt.security.credentials()
        try:
            if creds is None:
                return self.grpc.add_insecure_port(address)
            return self.grpc.add_secure_port(address, creds)
        except RuntimeError:
            return 0

    def _refused(self, who: str, client: int | None, why: str) -> None:
        self._count(why)
        log_event("server", "refused", sender=who, client=client, reason=why)

    def _count(self, why: str) -> None:
        self.metrics.refused(why)
        self.live.refused(why)

    def _say_refused(self, who: str, where: str, why: str, count: int) -> None:
        """A line of the refusals before the hub (``refusal_log.py``): one call's,
        or the count of an address's calls not said one by one."""
        log_event("server", "refused", sender=who, peer=where, reason=why, count=count)

    async def _start(self) -> None:
        await self.grpc.start()
        await self.health.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)

    def start(self) -> None:
        self.loop.run(self._start())
        self.metrics.watch(self.hub)
        self.live.start()
        log_event(
            "server", "listening", host=self.opt.host, port=self.port, auth=self.opt.security.mode
        )

    def wait_for_clients(self) -> None:
        dep = self.cfg.deployment
        need = dep.start_clients or self.cfg.num_clients
        if need > self.cfg.num_clients:
            raise ConfigError(
                f"deployment.start_clients = {need} is more than num_clients = "
                f"{self.cfg.num_clients}"
            )
        got = wait_for_joins(self.hub, need, dep.start_timeout_s)  # saying who joined
        if got < need:
            raise ConfigError(
                f"only {got} of the {need} clients needed to start joined within "
                f"{dep.start_timeout_s:g} s (deployment.start_clients, deployment.start_timeout_s)"
            )
        log_event("server", "clients_joined", clients=got)

    def finished(self, result: RunResult) -> None:
        """Tell the last round's COMMITs (its checkpoint is written) and log the end,
        with the payload bytes that crossed the wire."""
        self.engine.tell_commit(result.rounds[-1].round_idx + 1 if result.rounds else 0)
        hub = self.hub
        log_event(
            "server",
            "finished",
            run_dir=str(result.run_dir),
            stopped=result.stopped,
            wire_bytes_up=hub.bytes_up,
            wire_bytes_down=hub.bytes_down,
            eval_bytes_up=hub.eval_bytes_up,
            eval_bytes_down=hub.eval_bytes_down,
            peak_waiting_calls=self.service.waits.peak,  # at once (deployment.max_waiting_calls)
        )

    async def _stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.grpc.stop(grace=3.0)
        self.admission.log.flush()  # the refusals held back, counted in the log

    def stop(self, reason: str, dismiss: bool = True) -> None:
        """Stop serving; ``dismiss``: first tell the clients the run is over. Either
        way every waiting poll is answered before the server stops (not dismissed:
        told to come back, to a resumed server), so no call is left waiting."""
        if dismiss:  # and wait (a little) until every live client process heard it
            self.hub.finish(reason)
            end = time.monotonic() + self.heartbeat_timeout_s
            while self.hub.undismissed() and time.monotonic() < end:
                time.sleep(0.05)
        else:  # the run may be resumed: the polls are told to come back
            self.hub.halt(f"{reason}; the run may be resumed: try again later")
        self.loop.run(self._stop())
        self.loop.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.metrics.close()
        self.live.close(reason)


def _served(cfg: Config) -> Config:
    # the privacy noise comes from the OS unless the config says otherwise (a
    # resumed run keeps its stored config's and is told at start)
    cfg = dataclasses.replace(cfg, privacy=served_privacy(cfg.privacy))
    check_served_noise(cfg.privacy)
    _check_served(cfg)
    # the server's own engine never trains: the serial one is built (no probe)
    return override(cfg, {"engine": "serial", "workers": 1})


def _check_served(cfg: Config) -> None:
    """What a simulation may run but a deployment may not."""
    p, dep = cfg.privacy, cfg.deployment
    warning = served_noise_warning(p)
    if warning is not None:
        log_event("server", "noise_not_secret", warning=warning)
    if p.hides_updates and (dep.cold_start or dep.canary_every > 0):
        what = "deployment.cold_start" if dep.cold_start else "deployment.canary_every"
        why = [f"privacy.dp = {p.dp!r}"] if p.dp in ("local", "distributed") else []
        why += ["privacy.secagg"] if p.secagg else []
        why += ["privacy tiers"] if p.tiers.enabled else []
        raise ConfigError(
            f"{what} with {' and '.join(why)}: a client's evaluation report (its accuracy "
            "and loss, exact) would reach the server it keeps its own numbers from; set "
            "deployment.cold_start: false and deployment.canary_every: 0"
        )
    held = client_held_state(cfg)
    if held is not None and cfg.checkpoint_every != 1:
        raise ConfigError(
            f"checkpoint_every: {cfg.checkpoint_every} with {held}: a deployment needs 1 "
            "(the clients keep that state on their disks; a server resumed from an older "
            "checkpoint would re-run rounds their state has already passed)"
        )
    if held is not None and cfg.communication.upload_every != 1:
        raise ConfigError(
            f"communication.upload_every: {cfg.communication.upload_every} with {held}: a "
            "deployment needs 1 (the clients are told to keep their state when the next "
            "upload round begins, after the round's checkpoint)"
        )


def client_held_state(cfg: Config) -> str | None:
    """What state a deployment's clients keep from round to round, if any."""
    if cfg.communication.error_feedback:
        return "error feedback (each client's residual)"
    held = {
        "scaffold": "SCAFFOLD (each client's control variate)",
        "fedbn": "FedBN (each client's batch norm)",
    }
    return held.get(cfg.algorithm)


def serve(config: Config, options: ServerOptions) -> RunResult:
    """Run ``config`` as a deployment: listen, wait for clients, run, dismiss them."""
    cfg = _served(config)
    dep = Deployment(cfg, options)
    return _drive(
        dep,
        lambda: run(cfg, dep.data, progress=options.progress, engine=dep.engine, hooks=dep.hooks()),
    )


def serve_resume(run_dir: Path | str, options: ServerOptions) -> RunResult:
    """Continue the run in ``run_dir`` (after a crash) as a deployment."""
    with RunStore.open(run_dir, read_only=True) as stored:
        cfg = stored.config()
    _check_served(cfg)
    dep = Deployment(cfg, options)
    return _drive(
        dep,
        lambda: resume(
            run_dir, dep.data, progress=options.progress, engine=dep.engine, hooks=dep.hooks()
        ),
    )


def _drive(dep: Deployment, go: Callable[[], RunResult]) -> RunResult:
    """Start, wait for the clients, run; dismiss the clients only when the run
    finished (stopped by a signal or failed, it may be resumed: they wait)."""
    dep.start()
    dismiss = False
    try:
        dep.wait_for_clients()
        result = go()
        dep.finished(result)
        dismiss = result.stopped is None
        return result
    finally:
        dep.stop("the run ended" if dismiss else "the server stopped", dismiss)


__all__ = ["Deployment", "ServerOptions", "serve", "serve_resume"]

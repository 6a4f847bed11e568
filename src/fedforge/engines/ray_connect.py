"""How ``engine: ray`` reaches its cluster and what it may ask of it.

``connect`` joins the cluster at ``ray.address`` (else ``RAY_ADDRESS``) or
starts a local one. Ray itself retries an address that does not answer for
minutes and then raises a traceback; here an address with nothing listening is
refused at once in one line, and a cluster that refuses the driver (for
example one that requires token authentication the driver's environment does
not carry) is one line too.

``check_resources`` refuses, before any worker starts, a request the cluster
cannot meet (Ray would leave such workers pending forever): more CPUs or GPUs
over the workers than the cluster has, or GPUs on a cluster with none. A
cluster that adds nodes on demand (an autoscaler) is judged by what it has
when the run starts.
"""

from __future__ import annotations

import socket
from typing import Any

from fedforge.core.errors import EngineError

TCP_TIMEOUT_S = 5.0  # how long a cluster's address may take to accept a connection
NO_ADDRESS = (None, "", "auto", "local")  # Ray finds or starts the cluster itself


def host_port(address: str) -> tuple[str, int] | None:
    """The host and port of ``ray://host:port`` or ``host:port``; None for a form
    Ray resolves itself or one without a numeric port."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def connect(ray: Any, address: str | None) -> None:
    """``ray.init`` at ``address`` (None: a local cluster), or one line saying why not."""
    where = host_port(address) if address not in NO_ADDRESS and address else None
    if where is not None:
        try:
            socket.create_connection(where, timeout=TCP_TIMEOUT_S).close()
        except OSError as exc:
            raise EngineError(
                f"no Ray cluster answers at ray.address {address!r} ({exc.strerror or exc}); "
                "start one there (ray start --head), or leave ray.address and RAY_ADDRESS "
                "unset to start a local cluster"
            ) from None
    try:
        ray.init(address=address, include_dashboard=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise EngineError(
            f"cannot join the Ray cluster at {address or 'a new local cluster'!r}: {why}; "
            "a cluster with token authentication needs RAY_AUTH_MODE=token and its token "
            "(RAY_AUTH_TOKEN) in the run's environment"
        ) from None


def check_resources(ray: Any, workers: int, num_cpus: float, num_gpus: float) -> None:
    """Refuse ``workers`` workers of ``num_cpus`` CPUs and ``num_gpus`` GPUs each
    where the cluster has fewer in all (one line naming both)."""
    have = ray.cluster_resources()
    for kind, each, key in (("CPU", num_cpus, "num_cpus"), ("GPU", num_gpus, "num_gpus")):
        total, need = float(have.get(kind, 0.0)), workers * each
        if need > total + 1e-9:
            raise EngineError(
                f"ray.workers {workers} x ray.{key} {each:g} asks for {need:g} {kind}s; the "
                f"Ray cluster has {total:g}: ask for fewer workers or less a worker"
            )

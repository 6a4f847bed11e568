"""Before a caller is known: what a peer without credentials can make a
deployment server write and hold.

- 2000 Hellos with forged signatures or unknown names are each refused and
  counted in the metric, while the log holds a few lines whose counts add up to 2000, and the
  honest clients' run finishes;
- calls waiting for their request past an address's cap, or past the server's,
  are answered RESOURCE_EXHAUSTED at once, and the caps hold exactly;
- the refusal log's window: per address the first few in full, then one count.
"""

from __future__ import annotations

import asyncio
import math
import re
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from deploy_procs import start_server, write_config
from deploy_sim import free_port
from fedforge import config as config_mod
from fedforge.core.errors import ConfigError
from fedforge.transport import refusal_log
from fedforge.transport.refusal_log import RefusalLog
from fedforge.transport.security import ServerSecurity
from fedforge.transport.serve import Deployment, ServerOptions, _served
from test_deployment_hostile import (
    attack,
    attack_lines,
    holding,
    keys_clients,
    keys_federation,
    rounds_done,
)

FORGED = 2000  # forged Hellos in all
UNKNOWN = 500  # of them claiming a name without a key


def _refused_metric(port: int, label: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(rf'^fedforge_refused_total\{{reason="{label}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_forged_signatures_are_counted_each_and_logged_in_a_few_lines(tmp_path: Path) -> None:
    """A peer with no key sends 1500 Hellos as 'alice' with random signatures and
    500 as 'mallory', whose name has no key: each is refused UNAUTHENTICATED and
    counted in fedforge_refused, the server's log says the first 3 in full and
    then one count per 10 s window (their counts add up to 2000), and the honest
    clients then run the federation."""
    fed = keys_federation(tmp_path)
    cfg = write_config(tmp_path / "cfg.yaml", rounds=2)
    metrics = free_port()
    keys = ("--certs", str(fed), "--auth", "keys", "--metrics-port", str(metrics))
    server, port = start_server(tmp_path, cfg, *keys)
    try:
        ca = str(fed / "ca.pem")
        t0 = time.monotonic()
        for name, calls in (("alice", FORGED - UNKNOWN), ("mallory", UNKNOWN)):
            forge = ("--calls", str(calls), "--name", name, "--ca", ca)
            p, out = attack(tmp_path, port, "forged", *forge)
            assert p.wait(300) == 0, out.read_text()
            forged = attack_lines(out)[-1]
            assert forged["ended"] == {"UNAUTHENTICATED": calls}, forged
        seconds = time.monotonic() - t0  # the attack's span, at most
        assert _refused_metric(metrics, "unauthenticated") == FORGED
        clients = keys_clients(tmp_path, port, fed)
        assert server.wait(120) == 0, server.log.read_text()
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        server.kill()
    assert rounds_done(server) == 2
    lines = [
        e
        for e in server.events()
        if e.get("event") == "refused" and re.search("bad signature|unknown client", e["reason"])
    ]
    assert sum(e["count"] for e in lines) == FORGED
    assert [e["count"] for e in lines[: refusal_log.FIRST]] == [1] * refusal_log.FIRST
    assert {e["peer"] for e in lines} == {"ipv4:127.0.0.1"}
    # each window the attack spanned: the first few in full, then one count
    windows = math.ceil(seconds / refusal_log.WINDOW_S) + 1
    assert len(lines) <= (refusal_log.FIRST + 1) * windows, [e["reason"] for e in lines]


def _snapshot(dep: Deployment) -> dict[str, int]:
    async def read() -> dict[str, int]:  # on the server's loop, where it changes
        return dict(dep.admission.pending)

    return dep.loop.run(read())


def _until(what: Any, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_calls_past_an_address_cap_or_the_servers_are_refused_at_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Caps of 8 calls waiting per address and 12 in all: idle calls from IPv6
    loopback (20) hold 8, then from IPv4 loopback (10) hold the 4 left; the
    calls past each are answered RESOURCE_EXHAUSTED (at once: a held one is
    waited for 60 s here), each cap named in the log."""
    deployment = {"pending_per_address": 8, "pending_calls": 12}
    cfg = _served(config_mod.load(write_config(tmp_path / "cfg.yaml", deployment=deployment)))
    dep = Deployment(cfg, ServerOptions(ServerSecurity("insecure"), host="localhost", port=0))
    dep.admission.request_wait_s = 60.0  # the held calls stay held while counted
    dep.start()
    attacks = []
    try:
        v6 = attack(tmp_path, dep.port, "idle", "--calls", "20", "--hold-s", "60", host="[::1]")
        attacks.append(v6)
        holding(*v6)
        _until(lambda: _snapshot(dep).get("ipv6:[::1]") == 8)
        v4 = attack(tmp_path, dep.port, "idle", "--calls", "10", "--hold-s", "60")
        attacks.append(v4)
        holding(*v4)
        _until(lambda: sum(_snapshot(dep).values()) == 12)
        time.sleep(1.0)  # the refused ones open again, and are refused again
        held = _snapshot(dep)
    finally:
        for p, _ in attacks:
            p.terminate()
            p.wait(30)
        dep.stop("done", dismiss=False)
    assert held == {"ipv6:[::1]": 8, "ipv4:127.0.0.1": 4}
    ended = [attack_lines(out)[-1]["ended"] for _, out in attacks]
    assert ended[0].get("RESOURCE_EXHAUSTED", 0) >= 12, ended
    assert ended[1].get("RESOURCE_EXHAUSTED", 0) >= 6, ended
    log = capfd.readouterr().err
    assert "ipv6:[::1] has 8 calls waiting for their request" in log
    assert "the server has 12 calls waiting for their request" in log


def test_the_refusal_log_says_the_first_few_of_an_address_then_a_count() -> None:
    """Window of 10 s, 3 in full per address: 10 refusals of A and 2 of B in one
    window are 5 full lines, then at its end one line of A's other 7; a refusal
    past the window starts a new one (said in full)."""
    said: list[tuple[str, str, int]] = []
    now = [0.0]
    log = RefusalLog(lambda who, where, why, n: said.append((where, why, n)), clock=lambda: now[0])
    for i in range(10):
        log.refused("?", "A", f"bad {i}")
        if i < 2:
            log.refused("?", "B", f"bad {i}")
    assert [(w, n) for w, _, n in said] == [("A", 1), ("B", 1), ("A", 1), ("B", 1), ("A", 1)]
    now[0] = 10.0
    log.refused("?", "A", "late")  # the first window closes: its count, then this one
    assert said[5:] == [
        ("A", "7 more refusals in 10 s, the last: bad 9", 7),
        ("A", "late", 1),
    ]


def test_the_refusal_log_bounds_its_lines_over_many_addresses() -> None:
    """300 addresses refused 5 times each in one window: 50 full lines, 50 count
    lines and one for the rest: 101 lines that account for all 1500."""
    said: list[int] = []
    log = RefusalLog(lambda who, where, why, n: said.append(n), clock=lambda: 0.0)
    for i in range(300):
        for _ in range(5):
            log.refused("?", f"ipv4:10.0.{i // 256}.{i % 256}", "unknown client")
    log.flush()
    assert len(said) == 2 * refusal_log.LINES + 1 == 101
    assert sum(said) == 1500


def test_pending_caps_are_configured_within_their_ranges() -> None:
    base = {"name": "x"}
    for fields, words in (
        ({"pending_per_address": 200, "pending_calls": 100}, r"\[1, pending_calls = 100\]"),
        ({"pending_calls": 0}, "must be an integer >= 1"),
        ({"pending_calls": 5000}, r"\[1, 4,096\]"),
    ):
        with pytest.raises(ConfigError, match=words):
            config_mod.from_dict({**base, "deployment": fields})


def test_a_window_closes_on_the_loop_by_itself() -> None:
    """With a loop running, the window's count is said when it ends, without a
    further refusal."""
    said: list[int] = []

    async def go() -> None:
        log = RefusalLog(lambda who, where, why, n: said.append(n), window_s=0.2, first=1)
        for _ in range(4):
            log.refused("?", "A", "why")
        await asyncio.sleep(0.4)

    asyncio.run(go())
    assert said == [1, 3]


def test_a_second_server_on_a_port_in_use_cannot_listen(tmp_path: Path) -> None:
    """A server listens on a port; a second one asked for the same port is
    refused in one line (it would otherwise share it, gRPC's SO_REUSEPORT
    handing each connection to one of the two; or, asked for ``localhost``,
    listen on ::1 alone), and the first serves on."""
    cfg = _served(config_mod.load(write_config(tmp_path / "cfg.yaml")))
    port = free_port()
    first = Deployment(cfg, ServerOptions(ServerSecurity("insecure"), host="127.0.0.1", port=port))
    first.start()
    try:
        assert first.port == port
        for host in ("127.0.0.1", "localhost", "0.0.0.0"):  # localhost: ::1 is free
            with pytest.raises(ConfigError, match=rf"cannot listen on {host}:{port} \(in use"):
                Deployment(cfg, ServerOptions(ServerSecurity("insecure"), host=host, port=port))
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # the first still accepts connections
    finally:
        first.stop("done", dismiss=False)

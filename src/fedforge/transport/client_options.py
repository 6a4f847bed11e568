"""What a ``fedforge client`` process is set up with (``ClientOptions``, from its
command line), when it joins again (``Lost``, ``RETRY``), and the test-only exit
point it reads from its environment (``TEST_EXIT_AT``). ``client.py`` is the
process that uses them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from fedforge.data.folder import ClientFolder
from fedforge.transport.backoff import TRANSIENT
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.security import ClientSecurity

# still transient after ``retry_s`` of retries, or the server has forgotten the
# session (a restarted server): join again, with backoff
RETRY = TRANSIENT | {grpc.StatusCode.NOT_FOUND}

# Fault injection for the deployment tests (tests/test_deployment_faults.py), not
# a user option: with FEDFORGE_TEST_EXIT_AT="ROUND:PHASE" in its environment the
# process exits at once (os._exit(1): no answer, no goodbye, as if killed) when a
# poll hands it work of round ROUND (0-based) and PHASE: a secure-aggregation
# phase's name (advertise, share_keys, masked_input, unmask), "train" or
# "evaluate". The work of one round and phase is posted to all of a process's
# clients at once, so none of them answers it.
TEST_EXIT_AT = "FEDFORGE_TEST_EXIT_AT"
_KINDS = {pb.Work.TRAIN: "train", pb.Work.EVALUATE: "evaluate"}


def exit_at() -> tuple[int, str] | None:
    """The (round, phase) FEDFORGE_TEST_EXIT_AT names; None when it is not set."""
    text = os.environ.get(TEST_EXIT_AT, "")
    if not text:
        return None
    r, _, phase = text.partition(":")
    return int(r), phase


def work_at(work: pb.Work) -> tuple[int, str]:
    """The (round, phase) of ``work`` as FEDFORGE_TEST_EXIT_AT names it."""
    return work.round_idx, work.phase if work.kind == pb.Work.PHASE else _KINDS.get(work.kind, "")


class Lost(Exception):
    """The server went away or forgot the session: join again."""


@dataclass
class ClientOptions:
    target: str  # host:port of the server
    security: ClientSecurity
    ids: list[int]  # the client ids this process hosts
    device: str = "cpu"
    poll_s: float = 10.0  # long-poll wait
    heartbeat_s: float = 2.0
    give_up_s: float = 300.0  # unreachable this long: exit
    retry_s: float = 60.0  # a call failing transiently is tried again this long
    max_bytes: int = 256 << 20
    chunk_bytes: int = 1 << 20
    state_dir: Path | None = None  # where the hosted clients' state persists (None: memory)
    data: dict[int, ClientFolder] | None = None  # each id's own examples (None: the simulator's)
    # follow the server's privacy.secret_noise: false (noise it can recompute); else
    # the noise comes from the OS whatever the server's config says
    trust_server_noise: bool = False
    # refuse to train unless each hosted client adds noise of at least this many
    # times its clip bound (0: no floor)
    min_noise_multiplier: float = 0.0
    # emulate a device this many times slower (>= 1): each local training of t
    # seconds is followed by (slowdown - 1) t of sleep, counted as training
    slowdown: float = 1.0

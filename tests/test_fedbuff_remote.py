"""FedBuff in ``fedforge server``'s engine, without the network: a real hub and
the network engine, the test answering as the clients in an order it chooses.
The server hands each free client the current model version, counts an
update's staleness from its own record of what it handed out (an upload naming
another version is refused), weights it by the rule, and steps."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from fedforge.client.runtime import ClientTask
from fedforge.config import Config
from fedforge.config.parse import from_dict
from fedforge.core.errors import ConfigError
from fedforge.server.collectors.intake import check_update
from fedforge.server.experiment import Experiment, build
from fedforge.server.loop import RunResult, run
from fedforge.transport.buffered_remote import BufferedRemoteEngine
from fedforge.transport.hub import Hub
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.remote import plan_from_json
from fedforge.transport.work import UPDATE

OWNER = "a"


def _config(deadline_s: float = 60.0, **asyn: Any) -> Config:
    return from_dict(
        {
            "dataset": "regression",
            "model": "linear",
            "num_clients": 3,
            "client_fraction": 1.0,
            "rounds": 3,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.05,
            "dtype": "float64",
            "target_accuracy": None,
            "robust": {"max_norm_multiple": None},
            "asynchronous": {"mode": "fedbuff", "concurrency": 2, "buffer_size": 1, **asyn},
            "deployment": {"round_deadline_s": deadline_s},
        }
    )


class Clients:
    """The three clients of one session, answering when the test says."""

    def __init__(self, hub: Hub, sim: Experiment) -> None:
        self.hub, self.sim = hub, sim
        self.session, _, _ = hub.join(OWNER, [(c, 100) for c in range(3)])
        self.held: dict[int, tuple[pb.Work, bytes]] = {}  # work and its model's payload
        self.handed: list[tuple[int, int]] = []  # (client, version) in hand-out order

    def wait_work(self, count: int) -> None:
        """Poll until ``count`` clients hold work."""
        for _ in range(100):
            if len(self.held) >= count:
                return
            for w in self.hub.poll(OWNER, self.session, 0.2, False):
                payload = self.hub.payload(OWNER, self.session, w.payload_id)
                self.held[w.client_id] = (w, payload)
                self.handed.append((w.client_id, w.model_version))
        raise AssertionError(f"only {len(self.held)} clients hold work")

    def update(self, cid: int) -> tuple[bytes, torch.Tensor]:
        """Client ``cid``'s update of its work, and its delta as the server decodes it."""
        w, payload = self.held[cid]
        task = ClientTask(cid, w.round_idx, plan_from_json(w.plan_json), w.seed)
        data = next(iter(self.sim.engine.run_cohort([task], payload))).data
        return data, check_update(self.sim, cid, w.round_idx, data).delta

    def answer(self, cid: int, data: bytes, version: int | None = None) -> str | None:
        """Upload ``data`` for ``cid``'s work (naming ``version``: else its work's)."""
        w, _ = self.held[cid]
        header = pb.UploadHeader(
            session=self.session,
            client_id=cid,
            round_idx=w.round_idx,
            kind=UPDATE,
            model_version=w.model_version if version is None else version,
            size=len(data),
            sha256=hashlib.sha256(data).digest(),
        )
        why = self.hub.submit(OWNER, header, data).wait(30)
        if version is None or version == w.model_version:
            del self.held[cid]
        return why


def _until(ok: Callable[[], bool]) -> None:
    for _ in range(100):
        if ok():
            return
        time.sleep(0.05)
    raise AssertionError("not within 5 s")


def _start(cfg: Config) -> tuple[Clients, threading.Thread, list[RunResult]]:
    hub = Hub(num_clients=3, heartbeat_timeout_s=60.0)
    clients = Clients(hub, build(cfg))
    out: list[RunResult] = []
    engine = BufferedRemoteEngine(hub, cfg)
    server = threading.Thread(target=lambda: out.append(run(cfg, engine=engine, store=False)))
    server.start()
    return clients, server, out


def test_each_update_is_weighted_by_the_staleness_of_the_version_the_server_handed_out() -> None:
    """M = 2, K = 1 (FedAsync), 1 / sqrt(1 + s). Step 1: two clients get version 0;
    x answers (staleness 0). Step 2: the free slot gets version 1 (client z);
    y's version-0 update claims version 1 and is refused with the server's
    record, then sent as it is: staleness 1, weight 1 / sqrt(2). Step 3: z's
    update, staleness 1. The model is recomputed from the decoded deltas."""
    cfg = _config()
    clients, server, out = _start(cfg)
    try:
        clients.wait_work(2)
        assert [v for _, v in clients.handed] == [0, 0]
        x, y = sorted(clients.held)
        params = build(cfg).initial_params.clone()
        data, delta = clients.update(x)
        assert clients.answer(x, data) is None
        params += delta  # staleness 0: weight 1
        clients.wait_work(2)  # the free slot: version 1
        z, version = clients.handed[-1]
        assert version == 1 and z != y
        data, delta = clients.update(y)
        assert clients.answer(y, data, version=1) == (
            f"client {y} answered for model version 1; it was given version 0"
        )
        assert clients.answer(y, data) is None
        params += delta / math.sqrt(2)
        clients.wait_work(2)
        assert clients.handed[-1][1] == 2
        # version 0 is withdrawn: no client at work holds it any more
        _until(lambda: set(clients.hub.payloads) == {"round-1", "round-2"})
        data, delta = clients.update(z)
        assert clients.answer(z, data) is None
        params += delta / math.sqrt(2)
    finally:
        server.join(60)
    (result,) = out
    assert len(result.rounds) == 3 and result.rejected == []
    torch.testing.assert_close(result.params, params, rtol=1e-12, atol=1e-12)


def test_an_update_staler_than_max_staleness_is_refused_with_the_reason() -> None:
    """max_staleness = 0: y's version-0 update arriving in step 2 is refused (its
    uploader told why, the run's refusals hold it); step 2 takes z's fresh one."""
    cfg = _config(max_staleness=0)
    clients, server, out = _start(cfg)
    try:
        clients.wait_work(2)
        x, y = sorted(clients.held)
        assert clients.answer(x, clients.update(x)[0]) is None
        clients.wait_work(2)
        z = clients.handed[-1][0]
        why = clients.answer(y, clients.update(y)[0])
        assert why == (
            f"client {y}'s update refused: it is 1 server steps stale, more than "
            "asynchronous.max_staleness = 0"
        )
        assert clients.answer(z, clients.update(z)[0]) is None
        clients.wait_work(2)
        w = clients.handed[-1][0]
        assert clients.answer(w, clients.update(w)[0]) is None
    finally:
        server.join(60)
    (result,) = out
    assert len(result.rounds) == 3
    assert [(r, c) for r, c, _ in result.rejected] == [(1, y)]


def test_work_past_its_deadline_frees_its_slot_and_its_late_upload_is_refused() -> None:
    """round_deadline_s = 1: the two clients handed version 0 never answer; both are
    dropouts, the third client gets the slot and its update makes the step; the
    first ones' late uploads are refused as not asked for."""
    cfg = dataclasses.replace(_config(deadline_s=1.0), rounds=1)
    clients, server, out = _start(cfg)
    try:
        clients.wait_work(2)
        late = sorted(clients.held)
        updates = {c: clients.update(c)[0] for c in late}
        clients.wait_work(3)  # the deadline passed: the third client is handed version 0
        (z,) = set(clients.held) - set(late)
        assert clients.handed[-1] == (z, 0)
        assert clients.answer(z, clients.update(z)[0]) is None
    finally:
        server.join(60)
    (result,) = out
    assert result.rounds[0].cohort_size == 1 and clients.hub.dropouts == 2
    for c in late:
        assert clients.answer(c, updates[c]) == (
            f"client {c} was not asked for a update in round 0 now"
        )


@pytest.mark.parametrize(
    ("section", "value", "said"),
    [
        ("deployment", {"canary_every": 2}, "deployment.cold_start or deployment.canary_every"),
        ("deployment", {"cold_start": True}, "deployment.cold_start or deployment.canary_every"),
        ("deployment", {"over_selection": 0.5}, "deployment.over_selection = 0.5"),
        ("communication", {"error_feedback": True, "uplink": "int8"}, "error_feedback"),
    ],
)
def test_what_the_network_cannot_buffer_is_refused_in_one_line(
    section: str, value: dict[str, Any], said: str
) -> None:
    """Refused before any work goes out (the simulator's refusals, e.g. DP or a
    robust rule, are the config's and hold here as well)."""
    cfg = dataclasses.replace(
        _config(), **{section: dataclasses.replace(getattr(_config(), section), **value)}
    )
    hub = Hub(num_clients=3, heartbeat_timeout_s=60.0)
    with pytest.raises(ConfigError, match="^asynchronous.mode = 'fedbuff' in fedforge server") as e:
        run(cfg, engine=BufferedRemoteEngine(hub, cfg), store=False)
    assert said in str(e.value) and "\n" not in str(e.value)
    assert hub.book.asked == {}

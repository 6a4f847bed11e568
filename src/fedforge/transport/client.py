"""``fedforge client``: a client process of a deployment. It connects out to the
server (so it works behind NAT), learns the run's config, joins with the client
ids it hosts (of the simulator's partition, or one id with its own examples:
``hosted.py``) and their example counts, and then polls for work: train from a
model and upload the update, answer a secure-aggregation phase, or evaluate.
The work itself is the simulator's (``ClientRuntime`` through the serial
engine): the same task gives the same bytes in a process of its own.

A call the server answers with a transient status (overloaded, away, slow) is
tried again with jittered exponential backoff for ``retry_s`` (``backoff.py``);
when the server stays unreachable (restarting after a crash) or forgot the
session, the process joins again, with backoff; it gives up after ``give_up_s``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from fedforge import __version__
from fedforge.client.runtime import ClientTask
from fedforge.core import wire
from fedforge.evaluation.evaluate import evaluate
from fedforge.server.experiment import Experiment, client_tables
from fedforge.transport.backoff import Backoff, retrying
from fedforge.transport.client_options import RETRY, ClientOptions, Lost, exit_at, work_at
from fedforge.transport.client_state import ClientStateFile
from fedforge.transport.hosted import (
    build_hosted,
    check_noise_floor,
    client_config,
    evaluation_data,
)
from fedforge.transport.in_flight import InFlight
from fedforge.transport.logs import log_event
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc
from fedforge.transport.plugins import check_client
from fedforge.transport.remote import plan_from_json
from fedforge.transport.serving import ServingModels
from fedforge.transport.work import UNJUDGED

T = TypeVar("T")


class ClientProcess:
    """One process hosting ``options.ids``."""

    def __init__(self, options: ClientOptions) -> None:
        self.opt = options
        self.name = options.security.name
        self.signer = options.security.signer()
        self.channel = options.security.channel(options.target, options.max_bytes)
        self.stub = pb_grpc.FederationStub(self.channel)
        self.exp: Experiment | None = None
        self.state: ClientStateFile | None = None
        self._trained_round: dict[int, int] = {}
        self.serving = ServingModels(None, options.ids, "")  # the models for inference
        self.config_yaml = ""
        self.plugins: list[pb.Plugin] = []  # this process's versions of the run's plugins
        self.session = ""
        self.stop = threading.Event()
        self.lost_since: float | None = None  # when the server was last out of reach
        self.beat = threading.Event()  # set: send a heartbeat now (work arrived, or stopping)
        self.exit_at = exit_at()
        self.in_flight = InFlight(len(options.ids))  # updates awaiting their verdicts

    # ------------------------------------------------------------------ wire
    def _signed(self, method: str, body: bytes) -> pb.Signed:
        if self.signer is None:
            return pb.Signed(auth=pb.Auth(client=self.name), body=body)
        env = self.signer.sign(method, body)  # type: ignore[attr-defined]
        auth = pb.Auth(
            client=env.client_name,
            nonce=env.nonce,
            timestamp=env.timestamp,
            signature=env.signature,
        )
        return pb.Signed(auth=auth, body=body)

    def _retrying(self, method: str, call: Callable[[], T]) -> T:
        """``call()``, tried again while it fails transiently (each try signed
        anew: a nonce is taken once); Lost: still failing, or an unknown session."""

        def said(exc: grpc.RpcError, pause: float) -> None:
            log_event(
                "client",
                "retry",
                method=method,
                code=exc.code().name,
                pause_s=pause,
                reason=exc.details() or "",
            )

        start = time.monotonic()
        since = self.lost_since or start  # out of touch since; give_up_s counts from there
        left = self.opt.give_up_s - (start - since)
        try:
            return retrying(call, max(0.0, min(self.opt.retry_s, left)), said)
        except grpc.RpcError as exc:
            if exc.code() in RETRY:
                self.lost_since = since
                raise Lost(f"{method}: {exc.code().name}") from None
            raise

    def _unary(self, method: str, body: bytes, timeout: float) -> object:
        stub = getattr(self.stub, method)
        return self._retrying(method, lambda: stub(self._signed(method, body), timeout=timeout))

    # ------------------------------------------------------------------ session
    def connect(self) -> None:
        """Hello (the config; the client is built on first sight) and Join."""
        hello = self._unary(
            "Hello", pb.HelloRequest(client_version=__version__).SerializeToString(), 30
        )
        assert isinstance(hello, pb.HelloReply)
        if hello.config_yaml != self.config_yaml:
            # the run's plugins, here and the same: before anything is built of the config
            self.plugins = check_client(hello.plugins, hello.config_yaml)
            cfg = client_config(hello.config_yaml, self.opt.device, self.opt.trust_server_noise)
            exp = build_hosted(cfg, self.opt.ids, self.opt.data, hello.data_spec_json)
            check_noise_floor(exp, self.opt.ids, self.opt.min_noise_multiplier)
            self.exp = exp
            self.config_yaml = hello.config_yaml
            self.serving = ServingModels(self.opt.state_dir, self.opt.ids, hello.config_yaml)
            if self.opt.state_dir is not None:
                tables = client_tables(self.exp)
                self.state = ClientStateFile(
                    self.opt.state_dir,
                    tables,
                    self.opt.ids,
                    hello.config_yaml,
                    self.exp.algorithm.client,
                )
                log_event("client", "state_loaded", rows=self.state.load())
        assert self.exp is not None
        data = self.exp.data
        members = [
            pb.Member(
                client_id=c,
                num_examples=data.num_examples(c),
                num_eval_examples=len(evaluation_data(self.exp, c)[1]),
            )
            for c in self.opt.ids
        ]
        join = pb.JoinRequest(members=members, plugins=self.plugins)
        reply = self._unary("Join", join.SerializeToString(), 30)
        assert isinstance(reply, pb.JoinReply)
        for r in reply.refused:
            log_event("client", "join_refused", client=r.client_id, reason=r.reason)
        if not reply.accepted:
            raise SystemExit(f"fedforge client: the server accepted none of clients {self.opt.ids}")
        self.session = reply.session
        log_event(
            "client", "joined", name=self.name, run=hello.run_name, clients=list(reply.accepted)
        )

    # ------------------------------------------------------------------ work
    def run(self) -> int:
        """Serve until the server says the run is over (0), cannot be reached (1) or
        refuses this process (2: not authenticated, revoked, a malformed request)."""
        try:
            return self._serve_beating()
        except grpc.RpcError as exc:
            code = exc.code()
            log_event("client", "refused", code=code.name, reason=exc.details())
            self.stop.set()
            return 2

    def _serve_beating(self) -> int:
        beat = threading.Thread(target=self._heartbeats, daemon=True)
        try:
            return self._serve(beat)
        finally:
            # the heartbeat thread ends before the process does: a daemon thread
            # still ending at interpreter exit may drop the last reference to this
            # process's model there, and freeing a tensor then aborts the process
            # (SIGABRT, "terminate called without an active exception")
            self.stop.set()
            self.beat.set()
            if beat.is_alive():
                beat.join()
            self.in_flight.close()

    def _serve(self, beat: threading.Thread) -> int:
        backoff = Backoff()
        while True:
            try:
                if not self.session:
                    self.connect()
                    if not beat.is_alive():
                        beat.start()
                if self._poll_once():
                    return 0
                self.lost_since = None
                backoff.reset()
            except Lost as exc:
                self.session = ""
                now = time.monotonic()
                self.lost_since = self.lost_since or now
                if now - self.lost_since > self.opt.give_up_s:
                    log_event("client", "gave_up", reason=str(exc))
                    return 1
                time.sleep(backoff.pause())

    def _poll_once(self) -> bool:
        body = pb.PollRequest(session=self.session, wait_s=self.opt.poll_s)
        reply = self._unary("Poll", body.SerializeToString(), self.opt.poll_s + 30)
        assert isinstance(reply, pb.PollReply)
        if reply.work:  # busy from now: a heartbeat, which the server holds open, at once
            self.beat.set()
        if self.exit_at is not None and any(work_at(w) == self.exit_at for w in reply.work):
            r, phase = self.exit_at
            log_event("client", "test_exit", round=r, phase=phase)
            os._exit(1)
        commits = [w for w in reply.work if w.kind == pb.Work.COMMIT]
        if commits:  # the round's used clients arrive together (one hand-out)
            self._commit(commits)
        serves = [w for w in reply.work if w.kind == pb.Work.SERVE]
        if serves:
            self._take_serving(serves)
        for work in reply.work:
            if work.kind not in (pb.Work.COMMIT, pb.Work.SERVE):
                self._do(work)
        self.in_flight.wait()
        return bool(reply.done and not reply.work)

    def _heartbeats(self) -> None:
        """A heartbeat every ``heartbeat_s``; while the process works the server holds
        each open (its closing tells the server this process died), and the next
        follows at once: a call is open all the while."""
        wait = self.opt.heartbeat_s
        while not self.stop.is_set():
            self.beat.wait(wait)
            self.beat.clear()
            if self.stop.is_set():
                return
            wait = self.opt.heartbeat_s
            if not self.session:
                continue
            body = pb.PollRequest(session=self.session, heartbeat=True).SerializeToString()
            began = time.monotonic()
            with contextlib.suppress(grpc.RpcError):  # the main loop notices, joins again
                self.stub.Poll(self._signed("Poll", body), timeout=10)
            if time.monotonic() - began >= self.opt.heartbeat_s:  # held open: again at once
                wait = 0.0

    def _commit(self, works: list[pb.Work]) -> None:
        """Keep the state the used clients computed (SCAFFOLD's c_k+) in the round
        each COMMIT names (a repeated notice, after a restart, of a round whose
        state is already kept or replaced by a later round's changes nothing);
        save it, then acknowledge each notice (unacknowledged ones come again)."""
        assert self.exp is not None
        terms = self.exp.algorithm.client
        rounds = self.trained_round
        used = [w.client_id for w in works if rounds.get(w.client_id) == w.round_idx]
        if terms is not None:  # the others' state waits for their own round's notice
            terms.commit_used(used)
        for c in used:
            rounds.pop(c, None)
        self._save()
        for w in works:
            self._upload(w, "notice", b"")

    def _take_serving(self, works: list[pb.Work]) -> None:
        """Keep the serving version each SERVE names (downloaded once for the clients
        that lack it), then acknowledge each (unacknowledged ones come again)."""
        assert self.exp is not None
        for w in works:
            new = [v.client_id for v in works if v.payload_id == w.payload_id]
            if self.serving.needs(w.client_id, w.model_version):
                try:
                    data = self._download(w.payload_id)
                except Lost:  # a version replaced meanwhile: its successor's notice follows
                    log_event("client", "serving_gone", version=w.model_version)
                    continue
                decoded = wire.decode(data)
                made = int(decoded.meta.get("round_idx", w.round_idx))
                self.serving.keep(
                    w.model_version, made, decoded.tensors["params"], self.exp.spec, new
                )
            self._upload(w, "served", b"")

    @property
    def trained_round(self) -> dict[int, int]:
        """Each hosted client's round whose state waits for the server's COMMIT
        (on disk with --state-dir)."""
        return self.state.trained_round if self.state is not None else self._trained_round

    def _save(self) -> None:
        if self.state is not None:
            self.state.save()

    def _do(self, work: pb.Work) -> None:
        assert self.exp is not None
        engine = self.exp.engine
        if work.kind == pb.Work.PHASE:
            reply = engine.run_phase(work.phase, {work.client_id: work.message})
            self._upload(work, "reply", reply.get(work.client_id, b""))
        elif work.kind == pb.Work.TRAIN:
            data = self._train(work)
            self.in_flight.send(lambda: self._upload(work, "update", data))
        elif work.kind == pb.Work.EVALUATE:
            self._upload(work, "evaluation", self._evaluate(work))

    def _evaluate(self, work: pb.Work) -> bytes:
        """The model's scores on this client's own data, as a JSON report."""
        assert self.exp is not None
        exp = self.exp
        params = wire.decode(self._download(work.payload_id)).tensors["params"]
        x, y = evaluation_data(exp, work.client_id)
        ev = evaluate(exp.model, exp.spec, params, x, y, exp.cfg.evaluation.batch_size, exp.metrics)
        report = {"accuracy": ev.accuracy, "loss": ev.loss, "num_examples": int(len(y))}
        return json.dumps(report).encode()

    def _train(self, work: pb.Work) -> bytes:
        """The update for ``work``: computed, with the state it moved saved together
        with it before it is sent; or, asked again after a restart, the one saved."""
        assert self.exp is not None
        key = (work.client_id, work.round_idx)
        if self.state is not None and key in self.state.outbox:
            return self.state.outbox[key]
        payload = self._download(work.payload_id)
        plan = plan_from_json(work.plan_json)
        task = ClientTask(work.client_id, work.round_idx, plan, work.seed)
        data = next(iter(self.exp.engine.run_cohort([task], payload))).data
        self.trained_round[work.client_id] = work.round_idx
        if self.state is not None:  # e.g. the error-feedback residual moved with it
            self.state.outbox = {k: v for k, v in self.state.outbox.items() if k[1] >= key[1]}
            self.state.outbox[key] = data
            self.state.save()
        return data

    def _download(self, payload_id: str) -> bytes:
        """The model, downloaded for each client it hosts: each is a device of its
        own, and the bytes the run store counts are the bytes that were sent."""
        body = pb.DownloadRequest(session=self.session, payload_id=payload_id).SerializeToString()

        def once() -> bytes:
            signed = self._signed("Download", body)
            return b"".join(c.data for c in self.stub.Download(signed, timeout=300))

        try:
            return self._retrying("Download", once)
        except grpc.RpcError as exc:
            raise Lost(f"Download: {exc.code().name}") from None

    def _upload(self, work: pb.Work, kind: str, data: bytes) -> None:
        reply = self.send(work, kind, data)
        at = {"client": work.client_id, "round": work.round_idx + 1}
        if reply.accepted and kind == "update":
            log_event("client", "upload_accepted", **at)
        elif reply.reason.startswith(UNJUDGED):  # it may yet be taken
            log_event("client", "upload_unjudged", **at, reason=reply.reason)
        elif not reply.accepted:
            log_event("client", "upload_refused", **at, reason=reply.reason)

    def send(self, work: pb.Work, kind: str, data: bytes) -> pb.UploadReply:
        """Upload ``data`` as the answer of ``kind`` to ``work``: the signed header,
        then the chunks; the server's verdict (Lost: it cannot be reached)."""
        header = pb.UploadHeader(
            session=self.session,
            client_id=work.client_id,
            round_idx=work.round_idx,
            model_version=work.model_version,
            kind=kind,
            phase=work.phase if kind not in ("update", "notice") else "",
            size=len(data),
            sha256=hashlib.sha256(data).digest(),
        )
        body = header.SerializeToString()

        def parts() -> Iterator[pb.UploadPart]:
            yield pb.UploadPart(header=self._signed("Upload", body))
            for i in range(0, len(data), self.opt.chunk_bytes):
                yield pb.UploadPart(data=data[i : i + self.opt.chunk_bytes])

        try:
            reply: pb.UploadReply = self._retrying(
                "Upload", lambda: self.stub.Upload(parts(), timeout=300)
            )
        except grpc.RpcError as exc:
            return pb.UploadReply(accepted=False, reason=f"{exc.code().name}: {exc.details()}")
        return reply

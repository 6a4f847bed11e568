"""What an enrolled client can make the deployment server hold, over a real
server in this process and gRPC calls on loopback:

- repeats of an upload the round has not judged yet (its sender says its call
  was cut) hold one call waiting for the verdict, and not their bytes: each
  repeat takes the place of the call before, which is told ABORTED;
- downloads its client does not read hold a place at work each until their last
  chunk went, so a name's streams are bounded like its other calls;
- the uploads a name is sending at once declare at most
  ``deployment.max_message_mib`` together, not that much for each place at work.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import os
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from fedforge.report.reasons import refusal_label
from fedforge.transport.admission import CALLS_PER_NAME
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc
from fedforge.transport.work import TRAINING_PAYLOAD, Superseded, Verdict
from test_deployment_waits import code_of, join, poll, served, signed, until

NAME = "greedy"
PAYLOAD = f"{TRAINING_PAYLOAD}0"


def handed(dep: Any, stub: Any, payload: bytes = b"") -> str:
    """``NAME`` joined with client 0, asked for its round-1 update (of ``payload``,
    when given) and handed the work: its session."""
    session = join(stub, NAME, [0])
    if payload:
        dep.hub.serve(PAYLOAD, payload)
    work = pb.Work(
        kind=pb.Work.TRAIN,
        client_id=0,
        round_idx=0,
        model_version=0,
        payload_id=PAYLOAD if payload else "",
        deadline_s=300,
    )
    dep.hub.ask([work], 0)
    assert len(poll(stub, NAME, session, 5).result(timeout=30).work) == 1
    return session


def upload(stub: Any, session: str, data: bytes, hold: threading.Event | None = None) -> Any:
    """Client 0's round-1 update ``data`` in flight (a future); with ``hold``, its
    parts after the first wait until it is set."""
    header = pb.UploadHeader(
        session=session,
        client_id=0,
        round_idx=0,
        model_version=0,
        kind="update",
        size=len(data),
        sha256=hashlib.sha256(data).digest(),
    )

    def parts() -> Iterator[pb.UploadPart]:
        yield pb.UploadPart(header=signed(NAME, header.SerializeToString()))
        for i in range(0, len(data), 1 << 20):
            yield pb.UploadPart(data=data[i : i + (1 << 20)])
            if hold is not None:
                hold.wait(60)

    return stub.Upload.future(parts(), timeout=120)


def traced_mib() -> float:
    gc.collect()
    return tracemalloc.get_traced_memory()[0] / (1 << 20)


def test_repeats_of_an_unjudged_upload_hold_one_call_and_no_bytes(tmp_path: Path) -> None:
    """Round 1 judges its updates at its end (no round runs here: the verdict
    waits). Six repeats of a 4 MiB update, one after another: each ends the call
    before it with ABORTED and a reason naming the repeat; the last one hears the
    verdict when it comes. The server holds the first upload's bytes (the round's)
    and no repeat's: less than half a copy more once the repeats are in (one
    waiting call holding its bytes would be a whole copy; a 1 MiB chunk still
    held somewhere would fit)."""
    data = os.urandom(4 << 20)
    with served(tmp_path) as (dep, stub):
        session = handed(dep, stub)
        first = upload(stub, session, data)
        until(lambda: len(dep.hub.book.inbox) == 1)
        (answer,) = dep.hub.book.inbox
        tracemalloc.start()
        try:
            before = traced_mib()
            calls = [first]
            for _ in range(6):
                calls.append(upload(stub, session, data))
                until(lambda: calls[-2].done(), timeout=30)
            until(lambda: answer.verdict._waiter is not None)  # the last one waits
            grown = traced_mib() - before
        finally:
            tracemalloc.stop()
        for call in calls[:-1]:
            assert code_of(call) == "ABORTED"
            assert "a repeat of client 0's upload of round 1" in call.exception().details()
        assert not calls[-1].done()
        assert dep.admission.active == {}  # a wait holds no place at work
        assert grown < 2.0, f"{grown:.2f} MiB more held after the repeats"
        answer.verdict.settle(None)
        reply = calls[-1].result(timeout=30)
        assert reply.accepted and reply.reason == ""
        assert [a.data for a in dep.hub.book.inbox] == [data]  # the round has one copy


def test_a_verdicts_waits_leave_nothing_behind_them() -> None:
    """On the event loop alone: 5,000 calls wait in turn for one verdict, each
    superseded by the next; what they leave before the word comes is a few bytes
    a call (a wrapping of the verdict per call: about 1 KB), and the last one
    hears the word."""
    verdict = Verdict(3, 0)
    told: list[str | None] = []

    async def wait() -> None:
        try:
            told.append(await verdict.awaited(300))
        except Superseded:
            told.append("superseded")

    async def calls(n: int) -> float:
        first = asyncio.create_task(wait())
        await asyncio.sleep(0)
        tracemalloc.start()
        try:
            before = traced_mib()
            for _ in range(n):
                last = asyncio.create_task(wait())
                await asyncio.sleep(0)
            await asyncio.sleep(0.01)
            grown = traced_mib() - before
        finally:
            tracemalloc.stop()
        verdict.settle(None)
        await asyncio.gather(first, last)
        return grown * (1 << 20) / n

    per_call = asyncio.run(calls(5000))
    assert told == ["superseded"] * 5000 + [None]
    assert per_call < 100, f"{per_call:.0f} bytes a superseded call"


def test_downloads_not_read_hold_a_place_at_work_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 24 MiB payload in 1 MiB chunks (more than gRPC's flow-control windows
    let through unread): ``CALLS_PER_NAME`` downloads nobody reads hold that many
    places, the next is refused RESOURCE_EXHAUSTED naming the bound, one read to
    its end gives the whole payload and frees its place, and the others' places
    are freed when they are cancelled."""
    payload = os.urandom(24 << 20)
    with served(tmp_path) as (dep, stub):
        session = handed(dep, stub, payload)
        body = pb.DownloadRequest(session=session, payload_id=PAYLOAD).SerializeToString()
        # flow-control windows fixed at gRPC's initial ones (no bandwidth probe
        # growing them), so what is not read stays on the server's side
        fixed = grpc.insecure_channel(f"127.0.0.1:{dep.port}", [("grpc.http2.bdp_probe", 0)])
        unread = pb_grpc.FederationStub(fixed)
        streams = [unread.Download(signed(NAME, body), timeout=60) for _ in range(CALLS_PER_NAME)]
        try:
            until(lambda: dep.admission.active.get(NAME) == CALLS_PER_NAME, timeout=30)
            with pytest.raises(grpc.RpcError) as refused:
                next(stub.Download(signed(NAME, body), timeout=60))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"has {CALLS_PER_NAME} calls at work already" in str(refused.value.details())
            assert b"".join(c.data for c in streams[0]) == payload
            until(lambda: dep.admission.active.get(NAME) == CALLS_PER_NAME - 1, timeout=30)
        finally:
            for s in streams:
                s.cancel()
        until(lambda: NAME not in dep.admission.active, timeout=30)
        assert dep.hub.downloads == 1  # the one read to its end, on the record
        # the cancelled ones are no server error (grpc would log one, with a
        # traceback, for each reply it could not send)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        fixed.close()


def test_a_names_uploads_being_read_declare_the_message_bound_together(
    tmp_path: Path,
) -> None:
    """``max_message_mib: 8``, ``round_deadline_s: 3``: an upload declaring 6 MiB
    whose parts come slowly holds 6 MiB of the name's 8 (a cut one gives its
    share back). A second one declaring 6 MiB waits for room, its body unread,
    and is refused RESOURCE_EXHAUSTED naming the bound when none comes within
    the 3 s; a third, waiting when the slow one gets in, is read then (a repeat:
    it waits for the verdict in the first one's place)."""
    data = os.urandom(6 << 20)
    with served(tmp_path, max_message_mib=8, round_deadline_s=3) as (dep, stub):
        session = handed(dep, stub)
        cut = threading.Event()
        doomed = upload(stub, session, data, cut)
        until(lambda: dep.admission.reading.get(NAME) == len(data))
        doomed.cancel()
        until(lambda: NAME not in dep.admission.reading)
        cut.set()

        slow = threading.Event()
        first = upload(stub, session, data, slow)
        until(lambda: dep.admission.reading.get(NAME) == len(data))
        second = upload(stub, session, data)
        assert code_of(second) == "RESOURCE_EXHAUSTED"
        why = str(second.exception().details())
        assert f"'{NAME}' is sending uploads of {len(data)} bytes" in why
        assert f"the {8 << 20} bytes a name may send at once" in why
        assert "no room came in 3 s" in why
        assert refusal_label(why) == "busy"  # the metric's label: congestion, not size
        third = upload(stub, session, data)
        until(lambda: NAME in dep.admission.room)  # it waits
        assert dep.admission.reading == {NAME: len(data)} and dep.hub.book.inbox == []
        slow.set()
        until(lambda: first.done(), timeout=30)
        assert code_of(first) == "ABORTED"  # in, then the repeat took its place
        (answer,) = dep.hub.book.inbox
        answer.verdict.settle(None)
        assert third.result(timeout=30).accepted
        assert [a.data for a in dep.hub.book.inbox] == [data]
        assert dep.admission.reading == {} and dep.admission.room == {}


def test_an_upload_that_waited_for_room_is_asked_about_again(tmp_path: Path) -> None:
    """The hub is asked about an upload before it waits for room and again once
    it has room: the round may have moved on meanwhile (here the hub stops
    expecting it while it waits), and then its body is never read."""
    data = os.urandom(6 << 20)
    with served(tmp_path, max_message_mib=8) as (dep, stub):
        session = handed(dep, stub)
        slow = threading.Event()
        first = upload(stub, session, data, slow)
        until(lambda: dep.admission.reading.get(NAME) == len(data))
        second = upload(stub, session, data)
        until(lambda: NAME in dep.admission.room)
        dep.hub.expects = lambda owner, header: "round 1 is over"  # type: ignore[method-assign]
        slow.set()
        assert code_of(second) == "FAILED_PRECONDITION"
        assert "round 1 is over" in str(second.exception().details())
        until(lambda: first.done() or len(dep.hub.book.inbox) == 1, timeout=30)
        assert dep.admission.reading == {}

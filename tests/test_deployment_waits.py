"""Where the deployment server's polls wait: on its event loop, not in a thread.

- long polls far more than the hub's threads leave a Join answered at once, and
  hundreds of them beside an honest federation do not stall its rounds nor
  make a live client look gone;
- past ``deployment.max_waiting_calls`` a poll is told RESOURCE_EXHAUSTED;
- a call's end is heard even when it came before anyone listened for it;
- work handed to a call cut before its reply went out is handed out again;
- a server stopped by a signal answers its waiting polls and exits at once.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from deploy_procs import start_client, start_server, write_config
from fedforge import config as config_mod
from fedforge.transport import serve
from fedforge.transport.ids import parse_ids
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc
from fedforge.transport.questions import Questions, key_of
from fedforge.transport.security import ServerSecurity
from fedforge.transport.serve import Deployment, ServerOptions, _served
from fedforge.transport.service import Call
from fedforge.transport.work import NOTICE, UPDATE
from test_deployment_hostile import attack, holding, rounds_done


@contextmanager
def served(tmp: Path, **deployment: Any) -> Iterator[tuple[Deployment, pb_grpc.FederationStub]]:
    """An insecure server in this process (its hub and counts can be read), and
    a stub to it."""
    cfg = _served(config_mod.load(write_config(tmp / "cfg.yaml", deployment=deployment)))
    dep = Deployment(cfg, ServerOptions(ServerSecurity("insecure"), port=0))
    dep.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{dep.port}")
    try:
        yield dep, pb_grpc.FederationStub(channel)
    finally:
        channel.close()
        dep.stop("done")


def signed(name: str, body: bytes) -> pb.Signed:
    return pb.Signed(auth=pb.Auth(client=name), body=body)


def join(stub: pb_grpc.FederationStub, name: str, ids: list[int], timeout: float = 10) -> str:
    members = [pb.Member(client_id=c, num_examples=10) for c in ids]
    body = pb.JoinRequest(members=members).SerializeToString()
    return str(stub.Join(signed(name, body), timeout=timeout).session)


def poll(stub: pb_grpc.FederationStub, name: str, session: str, wait_s: float) -> Any:
    """A long poll in flight (a future)."""
    body = pb.PollRequest(session=session, wait_s=wait_s).SerializeToString()
    return stub.Poll.future(signed(name, body), timeout=wait_s + 30)


def code_of(future: Any) -> str:
    try:
        future.result(timeout=30)
        return "OK"
    except grpc.RpcError as exc:
        return str(exc.code().name)


def until(check: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
def test_waiting_polls_hold_no_thread_of_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forty long polls on a pool of four threads: a Join is answered within a
    second (a thread per wait would queue it behind them for 20 s), and when the
    run ends every poll is told so at once."""
    monkeypatch.setattr(serve, "MAX_WORKERS", 4)
    with served(tmp_path) as (dep, stub):
        names = [f"waiter-{i}" for i in range(4)]
        sessions = {n: join(stub, n, [i]) for i, n in enumerate(names)}
        polls = [poll(stub, n, sessions[n], 20) for n in names for _ in range(10)]
        time.sleep(1.5)  # every poll waits
        took = time.monotonic()
        assert join(stub, "late", [4], timeout=5)
        assert time.monotonic() - took < 1.0
        took = time.monotonic()
        dep.hub.finish("the run ended")
        replies = [p.result(timeout=5) for p in polls]
        assert time.monotonic() - took < 2.0
        assert all(r.done and r.reason == "the run ended" for r in replies)
        assert dep.service.waits.peak == 40


def test_past_the_bound_a_poll_is_told_resource_exhausted(tmp_path: Path) -> None:
    """With deployment.max_waiting_calls = 3, a fourth waiting poll is refused at
    once, saying which setting bounds it; the three are answered."""
    with served(tmp_path, max_waiting_calls=3) as (dep, stub):
        session = join(stub, "a", [0])
        polls = [poll(stub, "a", session, 20) for _ in range(3)]
        until(lambda: dep.service.waits.waiting == 3)
        extra = poll(stub, "a", session, 20)
        with pytest.raises(grpc.RpcError) as refused:
            extra.result(timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "deployment.max_waiting_calls" in refused.value.details()
        dep.hub.finish("over")
        assert [code_of(p) for p in polls] == ["OK"] * 3


def test_a_call_that_ended_before_a_callback_was_added_says_so() -> None:
    """A real aio call cut by its client: gRPC runs its done callbacks once the
    handler is over, so the hub's thread may come to add one later, which would
    never run. ``add_callback`` says False then (the hub acts at once); one
    added while the call was open ran at its end."""
    calls: list[Call] = []
    ended = threading.Event()

    async def handler(requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        call = Call(context)
        calls.append(call)
        assert call.add_callback(ended.set)
        await anext(requests)
        await asyncio.sleep(30)  # cancelled when the client cuts the call
        return b""

    async def main() -> None:
        server = grpc.aio.server()
        method = grpc.stream_unary_rpc_method_handler(handler)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("T", {"M": method}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()

        def client() -> None:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                future = channel.stream_unary("/T/M").future(iter([b"x"]), timeout=30)
                time.sleep(0.5)
                future.cancel()
                assert ended.wait(5)
                late = threading.Event()
                assert calls[0].add_callback(late.set) is False
                assert not late.wait(0.5)

        await asyncio.get_running_loop().run_in_executor(None, client)
        await server.stop(0)

    asyncio.run(main())
    assert calls[0].ended and not calls[0].sent


@pytest.mark.slow
def test_work_handed_to_a_call_cut_before_its_reply_is_handed_out_again(
    tmp_path: Path,
) -> None:
    """A poll waits; the round asks client 0 to train while the hub's lock is
    held elsewhere, so the poll's step that hands the work out waits for the
    lock while the client cuts its call. The reply never goes out, and the work
    is pending again, for the session's next poll, not left handed to a call
    that is gone."""
    with served(tmp_path) as (dep, stub):
        session = join(stub, "a", [0])
        first = poll(stub, "a", session, 20)
        time.sleep(0.5)  # it waits
        work = pb.Work(kind=pb.Work.TRAIN, client_id=0, round_idx=0, payload_id="round-0")
        with dep.hub.cond:
            dep.hub.ask([work], 0)
            time.sleep(0.3)  # the poll's step waits for the lock
            first.cancel()
            time.sleep(0.5)  # the server heard the call end
        key = (0, 0, UPDATE, "")
        time.sleep(0.3)
        assert dep.hub.book.asked[key].handed is None and dep.hub.book.pending[0] == [key]
        again = poll(stub, "a", session, 20).result(timeout=10)
        assert [(w.client_id, w.kind, w.round_idx) for w in again.work] == [(0, pb.Work.TRAIN, 0)]
        assert dep.hub.book.asked[key].session == session


def test_many_waiting_polls_beside_an_honest_federation(tmp_path: Path) -> None:
    """300 long polls from 20 joined names hosting a client each (more than the
    hub's 256 threads), held open while two honest client processes train: the
    rounds (each asks every client and closes at the 5 updates it needs) complete
    during the attack, no honest client is ever taken for gone, and every
    process exits 0."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        num_clients=26,
        client_fraction=0.2,
        rounds=3,
        deployment={"over_selection": 10.0},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    hold_s = 60.0
    p, out = attack(
        tmp_path,
        port,
        "polls",
        *("--names", "20", "--first-id", "6", "--calls", "15", "--hold-s", str(hold_s)),
    )
    try:
        holding(p, out)
        clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
        assert server.wait(hold_s + 60) == 0, server.log.read_text()
        assert p.poll() is None, f"the run outlasted the attack:\n{out.read_text()}"
        for c in clients:
            assert c.wait(60) == 0, c.log.read_text()
    finally:
        p.terminate()
        p.wait(30)
    assert rounds_done(server) == 3
    gone = [e for e in server.events() if e.get("event") == "client_gone"]
    assert not [e for e in gone if set(parse_ids(e["clients"])) & set(range(6))], gone
    finished = next(e for e in server.events() if e.get("event") == "finished")
    assert finished["peak_waiting_calls"] >= 300, finished


# slow: whether a client is waiting in a poll at the stop depends on timing (both
# may be uploading, and then neither is told); the default suite keeps the server's
# side of it, test_a_put_back_returns_exactly_the_polls_keys_ahead_of_newer_work
@pytest.mark.slow
def test_a_signal_stop_answers_the_waiting_polls_at_once(tmp_path: Path) -> None:
    """SIGTERM during a run: the server tells each waiting poll to come back (the
    run may be resumed) and exits within a few seconds, not after its polls'
    waits; the clients retry, a waiting one saying why."""
    cfg = write_config(tmp_path / "cfg.yaml", rounds=50)
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
    try:
        until(lambda: rounds_done(server) >= 1, timeout=120)
        took = time.monotonic()
        server.kill(signal.SIGTERM)
        assert server.popen.returncode == 128 + signal.SIGTERM, server.log.read_text()
        assert time.monotonic() - took < 6.0
        # a client waiting in a poll is told; one caught training or uploading
        # finds the server gone instead: each retries, at least one was told
        until(lambda: any(told(c) for c in clients), timeout=20)
        for c in clients:
            until(lambda c=c: any(e.get("event") == "retry" for e in c.events()), timeout=20)
    finally:
        for c in clients:
            c.kill()
        server.kill()


def told(client: Any) -> bool:
    """Whether ``client`` retried a poll, told the run may be resumed."""
    return any(
        e.get("event") == "retry" and "may be resumed" in e.get("reason", "")
        for e in client.events()
    )


def test_a_put_back_returns_exactly_the_polls_keys_ahead_of_newer_work() -> None:
    """Client 0's training, handed to session s1, then a notice posted: put back
    for another session it stays handed; for s1 it is pending again ahead of the
    notice, and a hand-out gives both in that order."""
    book = Questions()
    book.post([pb.Work(kind=pb.Work.TRAIN, client_id=0, round_idx=0)], 0, now=0.0)
    handed = book.hand_out([0], 1.0, "s1")
    book.post([pb.Work(kind=pb.Work.COMMIT, client_id=0, round_idx=0)], 0, now=2.0)
    train, notice = (0, 0, UPDATE, ""), (0, 0, NOTICE, "")
    assert [key_of(w) for w in handed] == [train]
    assert book.put_back([train], "s2") == [] and book.asked[train].session == "s1"
    assert book.put_back([train], "s1") == [train]
    assert book.pending[0] == [train, notice] and book.asked[train].handed is None
    assert [key_of(w) for w in book.hand_out([0], 3.0, "s1")] == [train, notice]

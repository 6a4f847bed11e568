"""Every answer's uploader hears the round's true word, without the network: a
round that stops reading its answers refuses the ones it did not judge, a word
not reached in time says so, and the same answer sent again is given the first
one's verdict."""

from __future__ import annotations

import asyncio
import hashlib

from fedforge.transport.hub import Hub
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.work import UPDATE, Verdict


def _round(n: int, **kw: object) -> tuple[Hub, str]:
    """A hub whose clients 0..n-1 were handed round 0's training."""
    hub = Hub(num_clients=6, heartbeat_timeout_s=5.0, **kw)  # type: ignore[arg-type]
    session, _, _ = hub.join("a", [(c, 10) for c in range(n)])
    hub.ask([pb.Work(kind=pb.Work.TRAIN, client_id=c, round_idx=0) for c in range(n)], 0)
    assert len(hub.poll("a", session, 0, False)) == n
    return hub, session


def _header(session: str, cid: int, data: bytes) -> pb.UploadHeader:
    return pb.UploadHeader(
        session=session,
        client_id=cid,
        kind=UPDATE,
        size=len(data),
        sha256=hashlib.sha256(data).digest(),
    )


def _word(verdict: Verdict) -> str | None:
    assert verdict.settled
    return verdict.future.result(0)


def test_a_stopped_gather_refuses_what_it_read_and_did_not_judge() -> None:
    """Four updates wait; the round thread reads two, judges the first, and stops:
    the second was read and never judged (the round ended), the other two were
    never read (the round closed). Nobody waits for a word that cannot come."""
    hub, session = _round(4)
    said = [hub.submit("a", _header(session, c, b"u%d" % c), b"u%d" % c) for c in range(4)]
    assert not any(v.settled for v in said)
    answers = hub.gather({(c, 0, UPDATE, "") for c in range(4)}, 5.0)
    first = next(answers)
    first.verdict.settle(None)
    second = next(answers)
    assert (first.client_id, second.client_id) == (0, 1)
    assert hub.book.inbox and len(hub.book.inbox) == 2  # read one at a time
    answers.close()
    assert [_word(v) for v in said] == [
        None,
        "client 1's update came after its round ended",
        "client 2's update came after its round closed",
        "client 3's update came after its round closed",
    ]
    assert hub.accepted == 2 and hub.bytes_up == 4 and hub.book.inbox == []


def test_a_gather_read_to_its_end_leaves_the_verdicts_to_the_round() -> None:
    """A round that judges its updates together (at its end) reads them all first:
    reading to the end says nothing for it."""
    hub, session = _round(2)
    said = [hub.submit("a", _header(session, c, b"u"), b"u") for c in range(2)]
    read = list(hub.gather({(c, 0, UPDATE, "") for c in range(2)}, 5.0))
    assert [a.client_id for a in read] == [0, 1] and not any(v.settled for v in said)
    read[1].verdict.settle("update norm 50 passes the bound 40")
    read[0].verdict.settle(None)
    assert [_word(v) for v in said] == [None, "update norm 50 passes the bound 40"]


def test_no_word_in_time_says_so_never_taken() -> None:
    hub, session = _round(1, verdict_wait_s=0.05)
    why = hub.answer("a", _header(session, 0, b"u"), b"u")
    assert why == (
        "no verdict on client 0's update of round 1 within 0.05 s: the round had not judged it yet"
    )
    # the gRPC server awaits it on its event loop: the same, and the word still stands
    verdict = hub.book.answered[(0, 0, UPDATE, "")][1]
    assert asyncio.run(verdict.awaited(0.05)) == why
    verdict.settle("delta holds non-finite values")
    assert asyncio.run(verdict.awaited(0.05)) == "delta holds non-finite values"


def test_the_same_update_again_gets_the_first_ones_verdict() -> None:
    """A client that lost the reply sends its update again: it hears what the first
    was told (taken, or why refused), while it is awaited and after; a different
    second update is refused, and only that is counted as a refusal."""
    refusals: list[tuple[int | None, str]] = []
    hub, session = _round(3, on_refusal=lambda who, c, why: refusals.append((c, why)))
    first = [hub.submit("a", _header(session, c, b"u%d" % c), b"u%d" % c) for c in range(3)]
    pending = hub.submit("a", _header(session, 2, b"u2"), b"u2")  # before any word
    assert pending is first[2] and not pending.settled
    words = {0: None, 1: "delta holds non-finite values", 2: None}
    for a in hub.gather({(c, 0, UPDATE, "") for c in range(3)}, 5.0):
        a.verdict.settle(words[a.client_id])
    again = [hub.answer("a", _header(session, c, b"u%d" % c), b"u%d" % c) for c in range(3)]
    assert again == [None, "delta holds non-finite values", None] == [_word(v) for v in first]
    other = hub.answer("a", _header(session, 0, b"v0"), b"v0")
    assert other == "a second, different update of client 0 in round 0"
    assert refusals == [(0, other)]
    assert hub.accepted == 3 and hub.bytes_up == 6  # the repeats were not taken again

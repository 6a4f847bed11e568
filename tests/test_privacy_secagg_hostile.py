"""A secure-aggregation client facing a hostile or broken server (Bonawitz et al.
2017; Bell et al. 2020): it aborts the round with a ProtocolError where the
paper's honest client stops (too few clients listed, U2 or U3 not what it shared
with, a phase asked twice, a share that does not decrypt or is mislabelled),
leaves out keys from outside its SecAgg+ neighbourhood as a faulty peer's, and
the round's driver counts an aborting client as a dropout, with the reason:
the round completes or is skipped, never crashes."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch
from tests.test_privacy_secagg_round import BASE, DP, SECAGG  # the tiny 2NN secagg run

from fedforge.config import from_dict
from fedforge.core.errors import FedforgeError, ProtocolError
from fedforge.data.federated import FederatedData
from fedforge.privacy import secagg_wire as sw
from fedforge.privacy.secagg import SecAggClient
from fedforge.privacy.secagg_masks import SHARE_BYTES, SHARE_PAIR, FixedPoint, modulus_bits
from fedforge.privacy.secagg_server import Simulated, secure_sum
from fedforge.server.collectors.secure import SecureSum
from fedforge.server.loop import run

FP = FixedPoint(16, 20)


def _keyed(n: int, t: int) -> dict[int, SecAggClient]:
    """n clients through key sharing and share routing, every one in U2."""
    cls = {i: SecAggClient(i, 0, t, FP) for i in range(n)}
    keys = {i: c.advertise() for i, c in cls.items()}
    sent = {i: c.share_keys(keys) for i, c in cls.items()}
    for j, c in cls.items():
        c.receive({i: sent[i][j] for i in cls if i != j}, list(range(n)))
    return cls


def _keys(n: int) -> dict[int, tuple[bytes, bytes]]:
    return {i: SecAggClient(i, 0, 2, FP).advertise() for i in range(n)}


def _stopped(cl: SecAggClient) -> None:
    """After an abort the client answers nothing more this round."""
    with pytest.raises(ProtocolError, match=f"client {cl.id} aborted the round"):
        cl.unmask([cl.id])


# ------------------------------------------------------------ share keys
def test_protocol_errors_are_fedforge_errors_not_value_errors() -> None:
    assert issubclass(ProtocolError, FedforgeError) and not issubclass(ProtocolError, ValueError)


def test_too_few_keys_abort() -> None:
    cl = SecAggClient(0, 0, 4, FP)
    keys = {**_keys(3), 0: cl.advertise()}
    with pytest.raises(ProtocolError, match="only 3 clients' keys; threshold is 4"):
        cl.share_keys(keys)
    _stopped(cl)


def test_keys_from_outside_the_neighbourhood_are_a_faulty_peers_left_out() -> None:
    cl = SecAggClient(0, 0, 2, FP, frozenset({0, 1, 4}))
    keys = {**_keys(5), 0: cl.advertise()}
    out = cl.share_keys(keys)
    assert sorted(out) == [1, 4] and cl.ignored == [2, 3] and sorted(cl.keys) == [0, 1, 4]


def test_too_few_keys_left_after_the_faulty_peers_abort() -> None:
    cl = SecAggClient(0, 0, 3, FP, frozenset({0, 1, 4}))
    keys = {i: k for i, k in _keys(5).items() if i != 1} | {0: cl.advertise()}
    with pytest.raises(ProtocolError, match=r"only 2 clients' keys \(2 faulty peer"):
        cl.share_keys(keys)  # neighbour 1 missing, 2 and 3 outside: 0 and 4 left
    _stopped(cl)


def test_a_key_without_a_shared_secret_is_a_faulty_peers() -> None:
    cl = SecAggClient(0, 0, 2, FP)
    keys = {**_keys(4), 0: cl.advertise()}
    keys[2] = (bytes(32), keys[2][1])  # a low-order point
    assert sorted(cl.share_keys(keys)) == [1, 3] and cl.ignored == [2]


@pytest.mark.parametrize("how", ["missing", "altered", "duplicate", "twice"])
def test_own_keys_altered_duplicate_keys_or_a_second_request_abort(how: str) -> None:
    cl = SecAggClient(0, 0, 2, FP)
    keys = {**_keys(4), 0: cl.advertise()}
    match = {
        "missing": "own keys",
        "altered": "own keys",
        "duplicate": "same keys",
        "twice": "already answered this round's share_keys",
    }[how]
    if how == "missing":
        del keys[0]
    elif how == "altered":
        keys[0] = keys[1]
    elif how == "duplicate":
        keys[3] = keys[2]
    else:
        cl.share_keys(keys)
    with pytest.raises(ProtocolError, match=match):
        cl.share_keys(keys)
    _stopped(cl)


# --------------------------------------------------- routed shares, masked input
@pytest.mark.parametrize(
    ("u2", "drop_from", "match"),
    [
        ([0, 1, 2, 3, 9], None, "U2 is not a set"),  # a made-up id
        ([1, 2, 3, 4], None, "U2 is not a set"),  # without the client itself
        ([0, 1, 2], None, "only 3 clients shared keys; threshold is 4"),
        ([0, 1, 2, 3, 4], 2, "not one from each other client"),
    ],
)
def test_a_bad_u2_or_missing_shares_abort(u2: list[int], drop_from: int | None, match: str) -> None:
    cls = {i: SecAggClient(i, 0, 4, FP) for i in range(5)}
    keys = {i: c.advertise() for i, c in cls.items()}
    sent = {i: c.share_keys(keys) for i, c in cls.items()}
    routed = {i: sent[i][0] for i in u2 if i not in (0, 9, drop_from)}
    with pytest.raises(ProtocolError, match=match):
        cls[0].receive(routed, u2)
    with pytest.raises(ProtocolError, match="aborted the round"):
        cls[0].masked_input(np.zeros(3))


def test_masked_input_without_u2_aborts() -> None:
    cl = SecAggClient(0, 0, 2, FP)
    with pytest.raises(ProtocolError, match="only 0 clients shared keys; threshold is 2"):
        cl.masked_input(np.zeros(3))
    _stopped(cl)


# ------------------------------------------------------------------ unmask
@pytest.mark.parametrize(
    ("u3", "match"),
    [
        ([0, 1, 90, 91, 92], "U3 is not a set"),  # made-up ids
        ([0, 2, 3, 4], "U3 is not a set"),  # without the client itself
        ([0, 1, 2], "only 3 masked inputs; threshold is 4"),
    ],
)
def test_a_bad_u3_aborts(u3: list[int], match: str) -> None:
    cls = _keyed(5, 4)
    with pytest.raises(ProtocolError, match=match):
        cls[1].unmask(u3)
    _stopped(cls[1])


def test_a_second_unmask_request_aborts() -> None:
    """Asked twice, a client gave a b share and then a mask-key share of the same
    client: both of its secrets and its update in the clear."""
    cls = _keyed(5, 4)
    kinds = cls[1].unmask([1, 2, 3, 4])
    assert kinds[0][0] == "s" and kinds[2][0] == "b"
    with pytest.raises(ProtocolError, match="already answered this round's unmask"):
        cls[1].unmask([0, 1, 2, 3, 4])


def test_a_mislabelled_or_undecryptable_share_aborts() -> None:
    cls = _keyed(4, 3)
    sender, cl = cls[2], cls[1]
    plain = SHARE_PAIR.pack(3, 1, bytes(SHARE_BYTES), bytes(SHARE_BYTES))  # says 3 -> 1
    nonce = os.urandom(12)
    cl.inbox[2] = nonce + sender._channel(1).encrypt(nonce, plain, sender._aad(2, 1))
    with pytest.raises(ProtocolError, match="share from client 2 is labelled 3 -> 1"):
        cl.unmask([0, 1, 2, 3])
    cls = _keyed(4, 3)
    cls[1].inbox[2] = bytes(len(cls[1].inbox[2]))
    with pytest.raises(ProtocolError, match="share from client 2 does not decrypt"):
        cls[1].unmask([0, 1, 2, 3])


# ------------------------------------------------- the reference driver
def test_secure_sum_counts_an_aborting_client_as_a_dropout() -> None:
    """Client 3 is sent only two clients' keys (t = 4): it aborts, the server
    sees a dropout, and the other six are summed."""
    n, p = 7, 40
    fp = FixedPoint(16, modulus_bits(1.0, n, 16))
    rng = np.random.default_rng(0)
    xs = {c: rng.uniform(-1, 1, p) / np.sqrt(p) for c in range(n)}
    sim = Simulated(xs, 0, 4, fp)

    def hostile(phase: str, c: int, msg: Any) -> Any:
        if phase == "share_keys" and c == 3:
            msg = {i: msg[i] for i in (2, 3, 4)}
        return sim(phase, c, msg)

    result = secure_sum(list(range(n)), p, 4, fp, hostile, round_idx=0)
    assert result.total is not None and result.survivors == [0, 1, 2, 4, 5, 6]
    assert "only 3 clients' keys" in sim.aborted[3]
    plain = sum(fp.encode(xs[c]) for c in result.survivors) & fp.mask
    assert np.array_equal(result.total, plain)


# ------------------------------------------------------------- in a round
@pytest.fixture
def data(make_data: Any, one_thread: None) -> FederatedData:
    return make_data([30, 20, 40, 30, 25, 35])


def _hostile_share_keys(
    monkeypatch: pytest.MonkeyPatch, victim: int, pick: Any
) -> list[tuple[int, set[int]]]:
    """The server sends client ``victim`` the keys ``pick(its neighbourhood, U1)``
    instead of its neighbourhood's; returns (round, outsiders sent) per round."""
    real = SecureSum._message
    sent: list[tuple[int, set[int]]] = []

    def message(self: SecureSum, name: str, c: int, ids: list[int]) -> bytes:
        if name != "share_keys" or c != victim:
            return real(self, name, c, ids)
        assert self.graph is not None
        near = set(self.graph.within(c, ids))
        chosen = pick(near, ids)
        sent.append((self.round_idx, set(chosen) - near))
        keys = {i: self.keys[i] for i in chosen}
        return sw.share_keys_message(self.round_idx, keys, self.graph.t)

    monkeypatch.setattr(SecureSum, "_message", message)
    return sent


def _plus(k: int) -> dict[str, Any]:
    return {**BASE, "privacy": {**DP, **SECAGG, "secagg_neighbours": k}}


def test_keys_from_outside_the_neighbourhood_are_ignored_in_a_round(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SecAgg+ with k = 2 of 6: client 0 is sent every client's keys. It leaves
    out the outsiders' and shares with its neighbours only: the round is the
    honest one, bit for bit."""
    honest = run(from_dict(_plus(2)), data, store=False)
    sent = _hostile_share_keys(monkeypatch, 0, lambda near, ids: ids)
    got = run(from_dict(_plus(2)), data, store=False)
    assert [r for r, _ in sent] == [0, 1] and all(len(out) == 3 for _, out in sent)
    assert not got.skipped and not got.rejected
    assert torch.equal(got.params, honest.params)


def test_a_client_left_with_too_few_keys_drops_out_with_the_reason(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SecAgg+ with k = 4 of 6 (t = 4 of each closed neighbourhood of 5): client 0
    is sent itself and the one client outside its neighbourhood. It aborts (1
    key left); the server logs why and counts a dropout; each of its neighbours
    keeps 4 of 5, so the round sums the other five."""

    def outsiders(near: set[int], ids: list[int]) -> list[int]:
        return [i for i in ids if i not in near or i == 0]

    sent = _hostile_share_keys(monkeypatch, 0, outsiders)
    got = run(from_dict(_plus(4)), data, store=False)
    assert [r for r, _ in sent] == [0, 1]
    assert [(r, c) for r, c, _ in got.rejected] == [(0, 0), (1, 0)]
    for _, _, why in got.rejected:
        assert why.startswith("secure aggregation: client 0 aborted the round: only 1 clients'")
        assert "faulty peer" in why and "(at 'share_keys')" in why
    assert not got.skipped and torch.isfinite(got.params).all()


def test_a_u2_below_t_makes_the_client_drop_out_of_its_masked_input(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client 2 is told that only two clients shared keys (t = 4): it aborts at
    the masked-input phase, and its upload is the abort note: a dropout with the
    reason; the other five are summed."""
    real = SecureSum._message

    def message(self: SecureSum, name: str, c: int, ids: list[int]) -> bytes:
        if name == "masked_input" and c == 2:
            return sw.masked_input_message(self.round_idx, {}, [2, 3])
        return real(self, name, c, ids)

    monkeypatch.setattr(SecureSum, "_message", message)
    got = run(from_dict({**BASE, "privacy": {**DP, **SECAGG}}), data, store=False)
    assert [(r, c) for r, c, _ in got.rejected] == [(0, 2), (1, 2)]
    for _, _, why in got.rejected:
        assert "client 2 aborted the round: only 2 clients shared keys" in why
        assert "(at 'masked_input')" in why
    assert not got.skipped and torch.isfinite(got.params).all()

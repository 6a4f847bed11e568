"""SecAgg+ (Bell et al. 2020): the random Harary graph is k-regular, symmetric and
derived from (seed, round); the masks still cancel bit for bit with dropouts at
every phase; a client masks with exactly k others; a neighbourhood with too few
survivors ends the round with the reason; the config refuses what cannot work;
a whole run equals the complete graph's run bit for bit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch
from tests.conftest import MakeData
from tests.test_privacy_secagg_round import BASE, DP, SECAGG  # the tiny 2NN secagg run

from fedforge.config import from_dict
from fedforge.core.errors import ConfigError, UploadError
from fedforge.data.federated import FederatedData
from fedforge.privacy import secagg, secagg_masks
from fedforge.privacy.secagg import PHASES
from fedforge.privacy.secagg_codec import SecAggCodec
from fedforge.privacy.secagg_graph import MaskGraph, complete_graph, harary, random_harary
from fedforge.privacy.secagg_masks import FixedPoint, modulus_bits
from fedforge.privacy.secagg_server import Simulated, secure_sum
from fedforge.privacy.secagg_wire import advertise_message, read_keys
from fedforge.server.experiment import build
from fedforge.server.loop import run


# ------------------------------------------------------------------ the graph
def test_harary_by_hand() -> None:
    assert harary(6, 2) == [{5, 1}, {0, 2}, {1, 3}, {2, 4}, {3, 5}, {4, 0}]
    assert harary(7, 4)[0] == {5, 6, 1, 2} and harary(7, 4)[3] == {1, 2, 4, 5}
    assert harary(5, 4) == [set(range(5)) - {p} for p in range(5)]  # k = n - 1: complete
    with pytest.raises(ValueError, match="even"):
        harary(10, 3)


@pytest.mark.parametrize(("n", "k"), [(10, 2), (25, 4), (100, 14), (9, 8)])
def test_graph_is_k_regular_symmetric_deterministic_and_per_round(n: int, k: int) -> None:
    cohort = sorted(np.random.default_rng(n).choice(1000, n, replace=False).tolist())
    g = random_harary(cohort, k, 7, 3, 0.66)
    assert set(g.adjacency) == set(cohort)
    for c in cohort:
        near = g.neighbours(c)
        assert len(near) == k and c not in near and near <= set(cohort)
        assert all(c in g.neighbours(j) for j in near)
    assert g.t == int(np.ceil(0.66 * (k + 1)))
    assert random_harary(list(reversed(cohort)), k, 7, 3, 0.66).adjacency == g.adjacency
    if k < n - 1:  # every other round (and seed) draws another ring
        assert random_harary(cohort, k, 7, 4, 0.66).adjacency != g.adjacency
        assert random_harary(cohort, k, 8, 3, 0.66).adjacency != g.adjacency


def test_a_cohort_no_larger_than_k_falls_back_to_the_complete_graph() -> None:
    g = random_harary([3, 5, 9], 4, 0, 0, 0.66)
    assert g.adjacency == complete_graph([3, 5, 9], 2).adjacency and g.t == 2


# ------------------------------------------------------------ the protocol
def _inputs(n: int, p: int, seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.uniform(-1, 1, p) / np.sqrt(p) for c in range(n)}


def _plain(xs: Mapping[int, np.ndarray], ids: list[int], fp: FixedPoint) -> np.ndarray:
    total = np.zeros(next(iter(xs.values())).size, dtype=np.uint64)
    for c in ids:
        total = total + fp.encode(xs[c])
    return total & fp.mask


N, K, P = 15, 6, 300


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("phase", PHASES)
def test_secagg_plus_sum_is_the_plain_sum_with_dropouts(seed: int, phase: str) -> None:
    """One client drops before ``phase``: every closed neighbourhood of 7 keeps
    t = ceil(0.66 * 7) = 5, so the round succeeds whoever drops."""
    fp = FixedPoint(16, modulus_bits(1.0, N, 16))
    xs = _inputs(N, P, seed)
    g = random_harary(list(range(N)), K, seed, 1, 0.66)
    assert g.t == 5
    drop = {int(np.random.default_rng(seed).integers(N))}
    sim = Simulated(xs, 1, g.t, fp, g)
    result = secure_sum(list(range(N)), P, 10, fp, sim, {phase: drop}, g)
    assert result.total is not None, result.reason
    expect = sorted(set(range(N)) - drop) if phase != "unmask" else list(range(N))
    assert result.survivors == expect
    assert np.array_equal(result.total, _plain(xs, expect, fp))


@pytest.mark.parametrize("seed", range(6))
def test_random_dropouts_at_several_phases_sum_or_name_a_neighbourhood(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    fp = FixedPoint(16, modulus_bits(1.0, N, 16))
    xs = _inputs(N, P, seed)
    g = random_harary(list(range(N)), K, seed, 0, 0.66)
    gone = rng.choice(N, 3, replace=False).tolist()
    drops: dict[str, set[int]] = {}
    for c, ph in zip(gone, rng.choice(PHASES, 3), strict=True):
        drops.setdefault(str(ph), set()).add(int(c))
    result = secure_sum(list(range(N)), P, 10, fp, Simulated(xs, 0, g.t, fp, g), drops, g)
    late = drops.get("unmask", set())
    u3 = sorted(set(range(N)) - (set(gone) - late))
    u2 = sorted(set(range(N)) - drops.get("advertise", set()) - drops.get("share_keys", set()))
    alive = set(u3) - late
    # independently: every client of U2 needs t of its closed neighbourhood to the end
    ok = all(len((g.neighbours(j) | {j}) & alive) >= g.t for j in u2)
    assert ok == (seed not in (1, 4))  # both outcomes are exercised
    if ok:
        assert result.total is not None, result.reason
        assert np.array_equal(result.total, _plain(xs, u3, fp))
    else:
        assert result.total is None and "neighbourhood" in (result.reason or "")


def test_the_sum_of_worst_case_inputs_over_the_whole_cohort_cannot_wrap() -> None:
    fp = FixedPoint(16, modulus_bits(1.0, N, 16))
    xs = {c: np.full(P, 1.0 if c % 3 else -1.0) for c in range(N)}
    g = random_harary(list(range(N)), K, 0, 0, 0.66)
    result = secure_sum(list(range(N)), P, 10, fp, Simulated(xs, 0, g.t, fp, g), None, g)
    assert result.total is not None
    assert np.allclose(fp.decode(result.total), sum(xs.values()))


@pytest.mark.parametrize("k", [2, 4, None])
def test_each_masked_input_uses_exactly_k_pairwise_masks(
    k: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 10
    fp = FixedPoint(16, modulus_bits(1.0, n, 16))
    xs = _inputs(n, 50, 0)
    g = random_harary(list(range(n)), k, 0, 0, 0.66) if k else complete_graph(range(n), 7)
    sim = Simulated(xs, 0, g.t, fp, g)
    calls: dict[str, int] = {}
    phase_now = [""]
    real = secagg_masks.keystream

    def counted(seed: bytes, size: int, bits: int) -> np.ndarray:
        calls[phase_now[0]] = calls.get(phase_now[0], 0) + 1
        return real(seed, size, bits)

    def spy(phase: str, c: int, msg: Any) -> Any:
        phase_now[0] = f"{phase}/{c}"
        out = sim(phase, c, msg)
        if phase == "share_keys":  # one ciphertext a neighbour
            assert sorted(out) == sorted(g.neighbours(c))
        return out

    monkeypatch.setattr(secagg, "keystream", counted)  # the self mask
    monkeypatch.setattr(secagg_masks, "keystream", counted)  # the pairwise masks
    result = secure_sum(list(range(n)), 50, g.t, fp, spy, None, g, round_idx=0)
    assert result.total is not None
    degree = k or n - 1
    for c in range(n):  # the self mask PRG(b) and one PRG(s_ij) a neighbour
        assert calls[f"masked_input/{c}"] == 1 + degree


def test_codec_clients_derive_the_servers_graph_from_the_advertised_cohort() -> None:
    codec = SecAggCodec(1.0, 12, 16, 0.66, [10] * 12, neighbours=4, seed=5)
    cohort = [0, 2, 3, 5, 7, 8, 9, 11]
    graph = codec.graph(4, cohort)
    assert graph.adjacency == random_harary(cohort, 4, 5, 4, 0.66).adjacency
    codec.phase("advertise", 3, advertise_message(4, cohort))
    assert codec.sessions[3].neighbourhood == graph.closed(3)
    # a message a client cannot take: it aborts (an abort note, no keys kept), noting why
    note = codec.phase("advertise", 3, advertise_message(4))
    assert note is not None
    with pytest.raises(UploadError, match="client 3 aborted the round: SecAgg.*cohort"):
        read_keys(note, 4, 3)
    assert "needs the round's cohort" in codec.aborted[3] and 3 not in codec.sessions
    assert codec.phase("advertise", 4, advertise_message(4, cohort)) is not None
    assert "not in the cohort" in codec.aborted[4]


def test_a_neighbourhood_with_too_few_survivors_ends_the_round() -> None:
    n, k = 12, 4  # t of a closed neighbourhood of 5: ceil(0.66 * 5) = 4
    fp = FixedPoint(16, modulus_bits(1.0, n, 16))
    xs = _inputs(n, 20, 4)
    g = random_harary(list(range(n)), k, 3, 0, 0.66)
    a, b = sorted(g.neighbours(0))[:2]  # two of client 0's neighbours drop
    sim = Simulated(xs, 0, g.t, fp, g)
    result = secure_sum(list(range(n)), 20, 8, fp, sim, {"masked_input": {a, b}}, g)
    first = next(c for c in range(n) if len((g.neighbours(c) | {c}) - {a, b}) < 4)
    assert result.total is None and result.survivors == []
    assert result.reason == (
        f"secure aggregation: client {first} has 3 of its 5 neighbourhood (itself "
        "included) left after 'masked_input', fewer than t = 4"
    )


def test_survivors_that_fall_apart_end_the_round_before_unmasking() -> None:
    """Ring of 9, k = 2 (t = 2 of each closed neighbourhood of 3): clients 1 and 4
    drop before masked input; every neighbourhood keeps t, but {2, 3} has no mask
    with the rest, so the unmasking shares would hand the server x_2 + x_3 (and
    the rest's sum) apart. The round ends instead, with the reason."""
    ring = harary(9, 2)
    g = MaskGraph({p: frozenset(ring[p]) for p in range(9)}, 2)
    assert g.split([0, 2, 3, 5, 6, 7, 8]) is not None and g.split(range(9)) is None
    assert g.split([0, 1, 2, 3, 5, 6, 7, 8]) is None  # a path: one group
    assert complete_graph(range(5), 3).split([0, 4]) is None
    fp = FixedPoint(16, modulus_bits(1.0, 9, 16))
    xs = _inputs(9, 20, 1)
    asked: list[str] = []
    sim = Simulated(xs, 0, g.t, fp, g)

    def call(phase: str, c: int, msg: Any) -> Any:
        asked.append(phase)
        return sim(phase, c, msg)

    result = secure_sum(list(range(9)), 20, 2, fp, call, {"masked_input": {1, 4}}, g, 0)
    assert result.total is None and "fall apart into groups" in (result.reason or "")
    assert "unmask" not in asked  # no share left any client


# ------------------------------------------------------------- config, runs
@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data([30, 20, 40, 30, 25, 35])


@pytest.mark.parametrize(
    ("priv", "match"),
    [
        ({**SECAGG, "secagg_neighbours": 3}, "secagg_neighbours' = 3 is invalid: must be an even"),
        ({**SECAGG, "secagg_neighbours": 0}, "secagg_neighbours' = 0 is invalid"),
        ({"secagg_neighbours": 2}, "with privacy.secagg = true"),
        ({**SECAGG, "secagg_neighbours": 6}, "below the cohort of 6 clients"),
    ],
)
def test_config_refuses_bad_neighbour_counts(
    data: FederatedData, priv: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        build(from_dict({**BASE, "privacy": {**DP, **priv}}), data)


def test_the_modulus_is_the_whole_cohorts(data: FederatedData) -> None:
    def bits(priv: dict[str, Any]) -> int:
        exp = build(from_dict({**BASE, "privacy": {**DP, **SECAGG, **priv}}), data)
        assert exp.privacy is not None and exp.privacy.secagg is not None
        return exp.privacy.secagg.fp.bits

    assert bits({"secagg_neighbours": 2}) == bits({}) == modulus_bits(0.5, 6, 30)


@pytest.mark.parametrize("drop", [{}, {"secagg_drop_unmask": 0.17}])
@pytest.mark.parametrize("k", [2, 4])
def test_a_secagg_plus_run_equals_the_complete_graph_run_bit_for_bit(
    data: FederatedData, k: int, drop: dict[str, float]
) -> None:
    """Both unmask the exact integer sum of the same fixed-point inputs, so the
    models are equal to the bit; SecAgg+ sends fewer shares."""
    complete = run(from_dict({**BASE, "privacy": {**DP, **SECAGG, **drop}}), data, store=False)
    priv = {**DP, **SECAGG, **drop, "secagg_neighbours": k}
    plus = run(from_dict({**BASE, "privacy": priv}), data, store=False)
    assert not plus.skipped and not complete.skipped and not plus.rejected
    assert torch.equal(plus.params, complete.params)
    assert all(a.bytes_up < b.bytes_up for a, b in zip(plus.rounds, complete.rounds, strict=True))
    assert plus.summary["privacy"]["secagg_neighbours"] == k


def test_a_short_neighbourhood_skips_the_run_round_and_keeps_the_model(
    data: FederatedData,
) -> None:
    """k = 4 of 6: two clients dropping before their masked inputs leave 4 >= t = 4
    overall, but some closed neighbourhood of 5 keeps only 3 of them."""
    priv = {**DP, **SECAGG, "secagg_neighbours": 4, "secagg_drop_masked_input": 0.34}
    before = build(from_dict({**BASE, "privacy": priv}), data).initial_params
    result = run(from_dict({**BASE, "privacy": priv}), data, store=False)
    assert torch.equal(result.params, before)
    assert [r for r, _ in result.skipped] == [0, 1]
    for _, why in result.skipped:
        assert "has 3 of its 5 neighbourhood" in why and "fewer than t = 4" in why


def test_a_masked_update_in_another_fixed_point_is_refused() -> None:
    """The server unmasks in its own (bits, frac_bits): words packed at other widths
    would be read wrong, so a header that says so is refused."""
    codec = SecAggCodec(1.0, 12, 16, 0.66, [10] * 12)
    bits = codec.fp.bits
    packed = torch.zeros((5 * bits + 7) // 8, dtype=torch.uint8)
    meta = {"codec": "secagg", "bits": bits, "frac_bits": 16}
    assert codec.decode_masked({"masked": packed}, meta, 5).shape == (5,)
    for bad in ({"bits": 3}, {"frac_bits": 99}, {"bits": None}):
        with pytest.raises(UploadError, match="fixed point"):
            codec.decode_masked({"masked": packed}, {**meta, **bad}, 5)
    with pytest.raises(UploadError, match="unexpected tensors junk"):
        codec.decode_masked({"masked": packed, "junk": packed}, meta, 5)

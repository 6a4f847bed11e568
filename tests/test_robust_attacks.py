"""Every simulated attack does what it claims, and attackers derive from the seed."""

from __future__ import annotations

import statistics

import pytest
import torch

from fedforge.core import wire
from fedforge.core.errors import UploadError
from fedforge.pipeline.codec import Dense
from fedforge.pipeline.pipeline import CohortUpdates, StageContext
from fedforge.robust.attacks import (
    Collusion,
    DeltaAttack,
    alie_z,
    attacker_ids,
    faulty,
    flipped_labels_fn,
    uint8_bytes,
    uint8_tamper,
)

F64 = torch.float64


def ctx(client_id: int | None, round_idx: int = 0, seed: int = 0) -> StageContext:
    return StageContext(round_idx, seed, client_id)


def test_attackers_are_a_seeded_fraction() -> None:
    a = attacker_ids(100, 0.2, seed=7)
    assert len(a) == 20 and all(0 <= c < 100 for c in a)
    assert a == attacker_ids(100, 0.2, seed=7)
    assert a != attacker_ids(100, 0.2, seed=8)
    assert attacker_ids(100, 0.0, seed=7) == frozenset()
    assert len(attacker_ids(10, 0.25, seed=0)) == 2  # round(2.5) = 2


def test_label_flip_only_for_attackers() -> None:
    y = torch.arange(10)
    x = torch.zeros(10, 1)
    fn = flipped_labels_fn(lambda c: (x, y), frozenset({3}), 10)
    assert torch.equal(fn(3)[1], 9 - y)
    assert torch.equal(fn(4)[1], y)


def test_delta_attacks() -> None:
    v = torch.tensor([1.0, -2.0, 3.0], dtype=F64)
    bad = frozenset({1})
    for kind, expected in (("sign_flip", -v), ("scaled", 10 * v)):
        stage = DeltaAttack(kind, bad)  # type: ignore[arg-type]
        assert torch.equal(stage.apply(v, ctx(1)), expected)
        assert torch.equal(stage.apply(v, ctx(2)), v)
    assert torch.equal(DeltaAttack("scaled", bad, scale=-3.0).apply(v, ctx(1)), -3 * v)
    nan_inf = DeltaAttack("nan_inf", bad).apply(v, ctx(1))
    assert not torch.isfinite(nan_inf).any() and nan_inf.isnan().any() and nan_inf.isinf().any()


def test_gaussian_attack_is_seeded_noise_of_the_stated_std() -> None:
    v = torch.zeros(20000, dtype=F64)
    stage = DeltaAttack("gaussian", frozenset({1}), std=2.0)
    a, b = stage.apply(v, ctx(1, round_idx=3)), stage.apply(v, ctx(1, round_idx=3))
    assert torch.equal(a, b)
    assert not torch.equal(a, stage.apply(v, ctx(1, round_idx=4)))
    assert abs(float(a.std()) - 2.0) < 0.05 and abs(float(a.mean())) < 0.05


def test_uint8_accident_crosses_the_wire_and_is_refused() -> None:
    delta = torch.linspace(-1, 1, 10, dtype=torch.float32)
    raw = uint8_bytes(delta)
    assert raw.dtype == torch.float32 and raw.shape == (3,)  # 10 bytes padded to 12
    q = raw.view(torch.uint8)[:10]
    assert q[0] == 0 and q[-1] == 255  # min-max quantised
    tensors, meta = Dense().encode(delta)
    sent = uint8_tamper(frozenset({5}))(tensors, ctx(5))
    msg = wire.decode(wire.encode(sent, meta))
    with pytest.raises(UploadError, match=r"'delta' has shape \(3,\)"):
        Dense().decode(msg.tensors, msg.meta, 10, torch.float32)
    honest = uint8_tamper(frozenset({5}))(tensors, ctx(6))
    assert honest["delta"] is delta


def test_uint8_values_keep_the_length_and_send_0_to_255() -> None:
    delta = torch.tensor([-1.0, 0.0, 0.5, 1.0], dtype=F64)
    sent = DeltaAttack("uint8_values", frozenset({2})).apply(delta, ctx(2))
    # min-max to 0..255 by hand: (v + 1) / 2 * 255, rounded half to even
    assert sent.dtype == F64 and sent.shape == delta.shape
    assert sent.tolist() == [0.0, 128.0, 191.0, 255.0]
    assert DeltaAttack("uint8_values", frozenset({2})).apply(delta, ctx(3)) is delta


def test_intermittent_faults_follow_a_seeded_schedule() -> None:
    bad, v = frozenset({1, 4}), torch.tensor([1.0, -2.0], dtype=F64)
    stage = DeltaAttack("sign_flip", bad, probability=0.3)
    rounds = range(400)
    hit = [r for r in rounds if torch.equal(stage.apply(v, ctx(1, r, seed=7)), -v)]
    assert hit == [r for r in rounds if faulty(bad, 0.3, 7, r, 1)]
    assert 0.22 < len(hit) / 400 < 0.38  # about 0.3 of the rounds, not all, not none
    other = [r for r in rounds if faulty(bad, 0.3, 7, r, 4)]
    assert other != hit  # each client its own schedule
    assert hit != [r for r in rounds if faulty(bad, 0.3, 8, r, 1)]  # and each seed
    assert not any(faulty(bad, 0.3, 7, r, 2) for r in rounds)  # an honest client never
    assert all(faulty(bad, 1.0, 7, r, 1) for r in rounds)
    tamper = uint8_tamper(bad, probability=0.3)
    tensors = {"delta": torch.linspace(-1, 1, 10)}
    garbled = [r for r in rounds if tamper(tensors, ctx(1, r, seed=7)) is not tensors]
    assert garbled == hit


def test_an_intermittent_label_flip_is_refused() -> None:
    from fedforge.config import RobustConfig
    from fedforge.core.errors import ConfigError

    RobustConfig(attack="sign_flip", attack_fraction=0.1, attack_probability=0.5).check()
    with pytest.raises(ConfigError, match="attack_probability.*label_flip"):
        RobustConfig(attack="label_flip", attack_fraction=0.1, attack_probability=0.5).check()


def _cohort() -> CohortUpdates:
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(6, 4, generator=gen, dtype=F64)
    return CohortUpdates([0, 1, 2, 3, 4, 5], u, torch.ones(6, dtype=F64))


def test_alie_rewrites_attackers_to_mean_minus_z_std() -> None:
    c = _cohort()
    out, refused = Collusion("alie", frozenset({1, 4})).apply(c, ctx(None))
    honest = c.updates[[0, 2, 3, 5]]
    z = alie_z(6, 2)
    row = honest.mean(dim=0) - z * honest.std(dim=0, correction=0)
    assert refused == [] and out.client_ids == c.client_ids
    assert torch.equal(out.updates[1], row) and torch.equal(out.updates[4], row)
    assert torch.equal(out.updates[[0, 2, 3, 5]], honest)
    # Baruch et al.: n = 6, f = 2: s = floor(6/2 + 1) - 2 = 2, z = Phi^-1(4/6)
    assert z == pytest.approx(statistics.NormalDist().inv_cdf(4 / 6))
    fixed, _ = Collusion("alie", frozenset({1}), z=1.5).apply(c, ctx(None))
    h = c.updates[[0, 2, 3, 4, 5]]
    assert torch.equal(fixed.updates[1], h.mean(dim=0) - 1.5 * h.std(dim=0, correction=0))


def test_ipm_rewrites_attackers_to_minus_epsilon_mean() -> None:
    c = _cohort()
    out, _ = Collusion("ipm", frozenset({0}), epsilon=0.5).apply(c, ctx(None))
    assert torch.equal(out.updates[0], -0.5 * c.updates[1:].mean(dim=0))
    assert torch.equal(out.updates[1:], c.updates[1:])


def test_collusion_without_attackers_or_honest_clients_changes_nothing() -> None:
    c = _cohort()
    for attackers in (frozenset({9}), frozenset(range(6))):
        out, _ = Collusion("ipm", attackers).apply(c, ctx(None))
        assert torch.equal(out.updates, c.updates)


def test_collusion_over_a_lossy_uplink_sends_what_the_codec_carries() -> None:
    """Top-k of 2 entries: the attacker's crafted row reaches the server as its
    two largest entries only, as a real message over that channel would."""
    from fedforge.communication.sparsify import TopK

    c = _cohort()
    out, _ = Collusion("ipm", frozenset({0}), epsilon=0.5, codec=TopK(0.5)).apply(c, ctx(None))
    row = -0.5 * c.updates[1:].mean(dim=0)
    keep = row.abs().argsort(descending=True)[:2]
    expected = torch.zeros(4, dtype=F64)
    expected[keep] = row[keep]
    assert torch.equal(out.updates[0], expected)
    assert torch.equal(out.updates[1:], c.updates[1:])
    dense, _ = Collusion("ipm", frozenset({0}), epsilon=0.5, codec=Dense()).apply(c, ctx(None))
    assert torch.equal(dense.updates[0], row)  # a lossless codec changes nothing

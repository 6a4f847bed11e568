"""Robust aggregators against hand-worked cases, a plain-Python second
implementation (Krum, Bulyan), breakdown properties and refusals."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from fedforge.core.errors import AggregationError, ConfigError
from fedforge.robust import (
    Bulyan,
    CentredClip,
    GeometricMedian,
    Krum,
    Median,
    MultiKrum,
    NormBound,
    TrimmedMean,
    WeightedMean,
    min_updates,
)
from fedforge.robust.common import BLOCK_COLUMNS

F64 = torch.float64


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def ones(k: int) -> torch.Tensor:
    return torch.ones(k, dtype=F64)


def test_median_hand_worked() -> None:
    u = t([[1, 5], [2, -1], [10, 0]])
    assert torch.equal(Median().aggregate(u, ones(3)), t([[2, 0]])[0])
    even = t([[1], [2], [3], [10]])
    assert torch.equal(Median().aggregate(even, ones(4)), t([[2.5]])[0])


def test_median_and_trimmed_mean_ignore_weights() -> None:
    u = t([[1], [2], [100]])
    heavy = torch.tensor([1.0, 1.0, 1e9], dtype=F64)
    assert torch.equal(Median().aggregate(u, heavy), Median().aggregate(u, ones(3)))
    assert torch.equal(TrimmedMean(0.34).aggregate(u, heavy), t([[2]])[0])


def test_trimmed_mean_hand_worked() -> None:
    u = t([[1, -4], [2, 0], [3, 4], [10, 100]])
    # beta 0.25 of K = 4: one value dropped at each end of every column
    assert torch.equal(TrimmedMean(0.25).aggregate(u, ones(4)), t([[2.5, 2.0]])[0])
    assert torch.equal(TrimmedMean(0.0).aggregate(u, ones(4)), u.mean(dim=0))
    with pytest.raises(ConfigError, match="beta"):
        TrimmedMean(0.5)


def test_trim_just_under_a_half_leaves_a_value_to_average() -> None:
    # 3 clients, beta 0.49: floor(1.47) = 1 dropped at each end, the median left
    u = t([[1, -4], [2, 0], [30, 4]])
    assert torch.equal(TrimmedMean(0.49).aggregate(u, ones(3)), t([[2, 0]])[0])
    # a hair under 1/2: floor(beta K + tolerance) would drop K / 2 at each end of an
    # even K, nothing left; capped at (K - 1) // 2, the two middle values remain
    beta = 0.5 - 1e-10
    two = t([[1, 5], [3, -1]])
    assert torch.equal(TrimmedMean(beta).aggregate(two, ones(2)), t([[2, 2]])[0])
    four = t([[1, -4], [2, 0], [3, 4], [10, 100]])
    assert torch.equal(TrimmedMean(beta).aggregate(four, ones(4)), t([[2.5, 2.0]])[0])
    assert [TrimmedMean(beta).trimmed(k) for k in (1, 2, 3, 4, 5)] == [0, 0, 1, 1, 2]


def test_coordinate_rules_span_column_blocks() -> None:
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(5, BLOCK_COLUMNS + 7, generator=gen, dtype=F64)
    assert torch.equal(Median().aggregate(u, ones(5)), u.median(dim=0).values)
    expected = u.sort(dim=0).values[1:4].mean(dim=0)
    assert torch.allclose(TrimmedMean(0.2).aggregate(u, ones(5)), expected, rtol=0, atol=1e-15)


def test_krum_and_multi_krum_hand_worked() -> None:
    # 1-D points 0, 1, 2, 4, 100; f = 1: each score sums the n - f - 2 = 2 nearest
    # squared distances: 0 -> 1 + 4 = 5, 1 -> 1 + 1 = 2, 2 -> 1 + 4 = 5,
    # 4 -> 4 + 9 = 13, 100 -> 96^2 + 98^2.
    u = t([[0], [1], [2], [4], [100]])
    assert torch.equal(Krum(1).aggregate(u, ones(5)), t([[1]])[0])
    # Multi-Krum, m = n - f = 4: the four lowest scores are 1, 0, 2, 4
    assert torch.equal(MultiKrum(1).aggregate(u, ones(5)), t([[1.75]])[0])
    assert torch.equal(MultiKrum(1, m=2).aggregate(u, ones(5)), t([[0.5]])[0])


def _krum_reference(rows: list[list[float]], f: int, left: list[int]) -> int:
    """The plain-Python Krum pick among rows ``left`` (ties to the lower row)."""
    n = len(left)
    k = max(n - f - 2, 1)
    best, best_score = -1, math.inf
    for i in left:
        d = sorted(
            sum((a - b) ** 2 for a, b in zip(rows[i], rows[j], strict=True)) for j in left if j != i
        )
        score = sum(d[:k])
        if score < best_score:
            best, best_score = i, score
    return best


def _bulyan_reference(rows: list[list[float]], f: int) -> list[float]:
    left = list(range(len(rows)))
    picked = []
    for _ in range(len(rows) - 2 * f):
        i = _krum_reference(rows, f, left)
        picked.append(i)
        left.remove(i)
    beta = len(picked) - 2 * f
    out = []
    for c in range(len(rows[0])):
        col = sorted(rows[i][c] for i in picked)
        m = len(col)
        med = col[m // 2] if m % 2 else (col[m // 2 - 1] + col[m // 2]) / 2
        near = sorted(col, key=lambda v: (abs(v - med), v))[:beta]
        out.append(sum(near) / beta)
    return out


def test_bulyan_hand_worked() -> None:
    # f = 1, n = 7: repeated Krum picks 2, 1, 3, 0, 4 (worked in the reference);
    # theta = 5, beta = 3 values closest to the median 2: 1, 2, 3 -> 2.
    u = t([[0], [1], [2], [3], [4], [50], [-50]])
    bulyan = Bulyan(1)
    assert bulyan.select(u).tolist() == [2, 1, 3, 0, 4]
    assert torch.equal(bulyan.aggregate(u, ones(7)), t([[2.0]])[0])


@pytest.mark.parametrize("seed", range(5))
def test_krum_and_bulyan_match_a_plain_python_reference(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    u = torch.randint(-20, 20, (11, 3), generator=gen).to(F64)
    u[:2] *= 50  # two outliers
    rows = u.tolist()
    assert torch.equal(Krum(2).aggregate(u, ones(11)), u[_krum_reference(rows, 2, list(range(11)))])
    expected = torch.tensor(_bulyan_reference(rows, 2), dtype=F64)
    assert torch.allclose(Bulyan(2).aggregate(u, ones(11)), expected, rtol=0, atol=1e-12)


def test_geometric_median_optimality() -> None:
    # Fermat point of a triangle with all angles < 120 degrees: the unit vectors
    # from it to the three vertices sum to zero.
    u = t([[0, 0], [4, 0], [0, 3]])
    z = GeometricMedian(max_iter=1000, tol=1e-14).aggregate(u, ones(3))
    units = (u - z) / (u - z).norm(dim=1, keepdim=True)
    assert units.sum(dim=0).norm() < 1e-5
    # 1-D, odd count: the median
    line = t([[0], [1], [10]])
    assert (
        abs(float(GeometricMedian(max_iter=1000, tol=1e-14).aggregate(line, ones(3))[0]) - 1) < 1e-3
    )


@pytest.mark.parametrize("scale", [1e8, 1e10, 1e36])
def test_geometric_median_ignores_huge_outliers(scale: float) -> None:
    """Ten honest rows near the origin, two scaled by ``scale``: the geometric
    median stays with the honest ones (from the mean start it stopped at a norm
    of 2.05 for 1e8 and 188 for 1e10, and was inf for 1e36 in float32)."""
    gen = torch.Generator().manual_seed(0)
    honest = torch.randn(10, 50, generator=gen, dtype=F64) * 0.3
    outliers = torch.randn(2, 50, generator=gen, dtype=F64) * scale
    for dtype in (F64, torch.float32):
        if dtype == F64 and scale > 1e30:
            continue  # no overflow in float64
        u = torch.cat([honest, outliers]).to(dtype)
        z = GeometricMedian(max_iter=1000, tol=1e-12).aggregate(u, ones(12))
        assert torch.isfinite(z).all()
        reference = GeometricMedian(max_iter=1000, tol=1e-12).aggregate(honest, ones(10))
        # two of twelve far away pull the median only a little off the honest ones'
        assert float((z.double() - reference).norm()) < 0.5 * float(reference.norm() + 1)


def test_norm_bound_and_centred_clip_hand_worked() -> None:
    u = t([[3, 4], [0, 1]])
    w = torch.tensor([1.0, 3.0], dtype=F64)
    # clipped to norm 1: (0.6, 0.8) and (0, 1); weights 1 and 3
    expected = t([[0.15, 0.95]])[0]
    assert torch.allclose(NormBound(1.0).aggregate(u, w), expected, rtol=0, atol=1e-15)
    # adaptive: the median of the norms {5, 1} (lower middle) is 1: the same
    assert torch.allclose(NormBound(None).aggregate(u, w), expected, rtol=0, atol=1e-15)
    cc = CentredClip(1.0)
    assert torch.allclose(cc.aggregate(u, w), t([[0.3, 0.9]])[0], rtol=0, atol=1e-15)
    # the next round clips around the previous aggregate (0.3, 0.9)
    nxt = cc.aggregate(t([[0.3, 2.9]]), ones(1))
    assert torch.allclose(nxt, t([[0.3, 1.9]])[0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("f", [1, 2, 5])
def test_breakdown_median_of_2f_plus_1_stays_in_the_honest_range(f: int) -> None:
    gen = torch.Generator().manual_seed(f)
    for trial in range(20):
        honest = torch.rand(f + 1, 40, generator=gen, dtype=F64)
        scale = 10.0 ** (trial % 12)
        outliers = scale * torch.randn(f, 40, generator=gen, dtype=F64)
        rows = torch.cat([outliers, honest])[torch.randperm(2 * f + 1, generator=gen)]
        for rule in (Median(), TrimmedMean(f / (2 * f + 1))):
            out = rule.aggregate(rows, ones(2 * f + 1))
            assert (out >= honest.min(dim=0).values).all(), rule.name
            assert (out <= honest.max(dim=0).values).all(), rule.name


def test_krum_picks_an_honest_update_under_f_outliers() -> None:
    gen = torch.Generator().manual_seed(3)
    f = 3
    honest = torch.randn(2 * f + 3 - f, 20, generator=gen, dtype=F64)
    bad = 1e3 + torch.randn(f, 20, generator=gen, dtype=F64)
    out = Krum(f).aggregate(torch.cat([bad, honest]), ones(2 * f + 3))
    assert any(torch.equal(out, h) for h in honest)


@pytest.mark.parametrize(
    ("rule", "n", "text"),
    [
        (Krum(2), 6, "n >= 2f + 3 = 7"),
        (MultiKrum(1), 4, "n >= 2f + 3 = 5"),
        (Bulyan(1), 6, "4f + 3 = 7"),
    ],
)
def test_too_few_updates_are_refused(rule: Krum | Bulyan, n: int, text: str) -> None:
    with pytest.raises(AggregationError, match=re.escape(text)) as err:
        rule.aggregate(torch.zeros(n, 3, dtype=F64), ones(n))
    assert f"n = {n}" in str(err.value) and f"f = {rule.f}" in str(err.value)


def test_min_updates_and_flags() -> None:
    assert [min_updates(a) for a in (WeightedMean(), Krum(2), Bulyan(2), Median())] == [1, 7, 11, 1]
    robust = (Median(), TrimmedMean(0.1), Krum(1), Bulyan(1), GeometricMedian(), NormBound(1.0))
    assert all(a.needs_individual and not a.linear for a in robust)
    for a, k in itertools.product(robust, [7]):
        acc = a.start(2, F64)
        u = torch.arange(2 * k, dtype=F64).reshape(k, 2)
        for row in u:
            acc.add(row, 1.0)
        assert torch.equal(acc.result(), a.aggregate(u, ones(k)))


def test_distances_hold_when_updates_share_a_large_part() -> None:
    """Rows alike up to 1e-3 around a common part of norm ~130 (late rounds, or
    ALIE inside the honest spread): ||a||^2 + ||b||^2 - 2 a.b in float32 lost
    the distances to rounding (Krum then picked at random, attackers included).
    Against the distances of the differences, in float64."""
    from fedforge.robust.common import squared_distances

    gen = torch.Generator().manual_seed(1)
    common = torch.randn(20_000, generator=gen, dtype=torch.float64)
    rows = common + 1e-3 * torch.randn(11, 20_000, generator=gen, dtype=torch.float64)
    want = torch.cdist(rows, rows) ** 2
    got = squared_distances(rows.float()).double()
    off = ~torch.eye(11, dtype=torch.bool)
    assert torch.allclose(got[off], want[off], rtol=1e-3, atol=0)


@pytest.mark.parametrize("scale", [10.0, 1e6, 1e30])
def test_distances_and_krum_hold_in_float32_with_one_update_far_out(scale: float) -> None:
    """As above, plus one attacker sending ``scale`` times the common part (10:
    the ``scaled`` attack's default; 1e30: still finite in float32). Centring on
    the mean dragged the centre to the attacker (the honest distances were off
    by up to 1.7x at 10) and at 1e30 the float32 products overflowed: Krum then
    picked the attacker. Against float64 differences of the same float32 rows."""
    from fedforge.robust.common import squared_distances

    gen = torch.Generator().manual_seed(2)
    common = torch.randn(20_000, generator=gen)
    honest = common + 1e-3 * torch.randn(10, 20_000, generator=gen)
    rows = torch.cat([(scale * common)[None], honest]).float()
    exact = torch.cdist(rows.double(), rows.double()) ** 2
    got = squared_distances(rows)
    assert got.dtype == F64
    off = ~torch.eye(10, dtype=torch.bool)
    assert torch.allclose(got[1:, 1:][off], exact[1:, 1:][off], rtol=1e-4, atol=0)
    assert bool((got[0, 1:] > 1e3 * got[1:, 1:].max()).all())
    # Krum (f = 1) against the plain-Python reference on the same values
    pick = _krum_reference(rows.double().tolist(), 1, list(range(11)))
    assert pick != 0
    assert torch.equal(Krum(1).aggregate(rows, torch.ones(11)), rows[pick])


def test_distances_hold_within_a_cluster_away_from_the_median() -> None:
    """Two clusters 1000 spreads apart (6 and 5 rows, float32, non-IID-like): the
    median sits in the first, and the second's distances were lost to float32
    products (relative error 8, some clamped to 0). Against float64 differences."""
    from fedforge.robust.common import squared_distances

    gen = torch.Generator().manual_seed(0)
    base = torch.randn(100_000, generator=gen)
    side = torch.tensor([1.0] * 6 + [-1.0] * 5)[:, None]
    rows = (side * base * 1000 + torch.randn(11, 100_000, generator=gen)).float()
    exact = torch.cdist(rows.double(), rows.double()) ** 2
    got = squared_distances(rows)
    far = ~torch.eye(5, dtype=torch.bool)
    assert torch.allclose(got[6:, 6:][far], exact[6:, 6:][far], rtol=1e-5, atol=0)


def test_distances_are_exactly_symmetric_so_ties_go_to_the_lower_row() -> None:
    """Bulyan's last picks score each of a mutually nearest pair by the same
    distance: an exact tie, which must go to the lower row. A Gram product's two
    triangles differed in the last bits (d[3, 6] - d[6, 3] = 2.3e-13 here, found
    by a random search), and the pick went to row 6."""
    from fedforge.robust.common import squared_distances

    u = t(
        [
            [100.18726521513533, -158.49082815366748, 10.81830913275207, -16.64442301943276],
            [-1.2863274036074979, -0.8762072955832613, 0.4156017553495371, -0.6719734068702858],
            [0.570035292894286, -0.47863275313859494, 0.2788165189036586, -0.617598412755633],
            [0.7947359068526352, -0.43565355769854547, -1.2181479480305453, 0.2831608229913853],
            [1.0044784958219735, -0.6759633895371264, -0.106333314340281, -0.359773409481337],
            [0.9663961970973078, -0.6694799162004839, -0.8246930840590586, -0.7053283095670259],
            [0.8060368251734269, -0.18456585754553803, 0.8758848891955331, -0.21616544500229978],
        ]
    )
    d = squared_distances(u)
    assert torch.equal(d, d.T)
    assert Bulyan(1).select(u).tolist() == [4, 2, 5, 3, 1]
    expected = torch.tensor(_bulyan_reference(u.tolist(), 1), dtype=F64)
    assert torch.allclose(Bulyan(1).aggregate(u, ones(7)), expected, rtol=0, atol=1e-12)
    gen = torch.Generator().manual_seed(3)
    for k in (3, 8, 31):
        r = torch.randn(k, 1000, generator=gen)
        d = squared_distances(r)
        assert torch.equal(d, d.T)

"""Partition laws (disjoint, covering, deterministic under a seed), McMahan's shard
figures, refusals with clear errors, and the heterogeneity figure on hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest

from fedforge.config import PartitionConfig
from fedforge.core.errors import PartitionError
from fedforge.data.partition import (
    Partition,
    dirichlet,
    hsu,
    iid,
    make_partition,
    quantity_skew,
    shards,
    summarize,
)

MNIST_LIKE = np.repeat(np.arange(10), 6000)  # 60000 labels, 6000 per class
KINDS = ("iid", "shards", "dirichlet", "hsu", "quantity")


def assert_exact_cover(part: Partition, num_samples: int) -> None:
    everything = np.concatenate(part.client_indices)
    assert everything.dtype == np.int64
    assert everything.size == num_samples  # no sample twice ...
    assert np.array_equal(np.sort(everything), np.arange(num_samples))  # ... none left out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_clients", [1, 7, 100])
def test_disjoint_and_covering(kind: str, num_clients: int) -> None:
    cfg = PartitionConfig(kind=kind)  # type: ignore[arg-type]
    part = make_partition(cfg, num_clients, MNIST_LIKE, seed=3)
    assert part.num_clients == num_clients
    assert_exact_cover(part, MNIST_LIKE.size)
    assert part.sizes().min() >= 1


def same(a: Partition, b: Partition) -> bool:
    pairs = zip(a.client_indices, b.client_indices, strict=True)
    return all(np.array_equal(x, y) for x, y in pairs)


@pytest.mark.parametrize("kind", KINDS)
def test_seed_determines_partition(kind: str) -> None:
    cfg = PartitionConfig(kind=kind)  # type: ignore[arg-type]
    a = make_partition(cfg, 20, MNIST_LIKE, seed=1)
    b = make_partition(cfg, 20, MNIST_LIKE, seed=1)
    c = make_partition(cfg, 20, MNIST_LIKE, seed=2)
    assert same(a, b) and not same(a, c)


def test_iid_mcmahan_sizes() -> None:
    part = iid(60000, 100, np.random.default_rng(0))
    assert set(part.sizes().tolist()) == {600}
    uneven = iid(10, 3, np.random.default_rng(0))
    assert sorted(uneven.sizes().tolist()) == [3, 3, 4]


def test_shards_mcmahan() -> None:
    part = shards(MNIST_LIKE, 100, 2, np.random.default_rng(0))
    assert set(part.sizes().tolist()) == {300 * 2}
    for idx in part.client_indices:
        assert np.unique(MNIST_LIKE[idx]).size <= 2
        # each client's data is exactly two blocks of 300 from the label-sorted order
        blocks = np.unique(idx // 300)
        assert blocks.size == 2 and all(np.sum(idx // 300 == b) == 300 for b in blocks)


def test_shards_refuses_too_many() -> None:
    labels = np.arange(10) % 3
    with pytest.raises(PartitionError, match=r"6 clients x 2 shards_per_client = 12"):
        shards(labels, 6, 2, np.random.default_rng(0))
    assert shards(labels, 5, 2, np.random.default_rng(0)).sizes().tolist() == [2] * 5


def test_dirichlet_refusals() -> None:
    rng = np.random.default_rng(0)
    for alpha in (0.0, -1.0, float("nan")):
        with pytest.raises(PartitionError, match="alpha"):
            dirichlet(MNIST_LIKE, 10, alpha, rng)
    with pytest.raises(PartitionError, match="min_size"):
        dirichlet(np.zeros(10, dtype=np.int64), 4, 1.0, rng, min_size=3)
    with pytest.raises(PartitionError, match="raise alpha"):  # bounded retries, then why
        dirichlet(np.arange(40) % 2, 20, 1e-3, rng, min_size=2)


def test_dirichlet_refuses_a_hopeless_federation_after_ten_draws() -> None:
    """60,000 clients for 60,000 samples: thousands of clients come up empty in
    every draw; it used to take all 1000 draws (72 s) to say so."""

    class Counting:
        def __init__(self) -> None:
            self.rng, self.draws = np.random.default_rng(0), 0

        def dirichlet(self, alpha: np.ndarray) -> np.ndarray:
            self.draws += 1
            return self.rng.dirichlet(alpha)

        def permutation(self, x: np.ndarray) -> np.ndarray:
            return self.rng.permutation(x)

    rng = Counting()
    with pytest.raises(PartitionError, match=r"leaves on average \d+ of the 60000 clients"):
        dirichlet(MNIST_LIKE, 60_000, 0.5, rng)  # type: ignore[arg-type]
    assert rng.draws == 10 * 10  # ten draws of the ten classes


def test_dirichlet_min_size_and_skew() -> None:
    part = dirichlet(MNIST_LIKE, 50, 0.1, np.random.default_rng(0), min_size=20)
    assert part.sizes().min() >= 20
    assert_exact_cover(part, MNIST_LIKE.size)
    skewed = summarize(part, MNIST_LIKE, 10).heterogeneity
    flat = dirichlet(MNIST_LIKE, 50, 1000.0, np.random.default_rng(0))
    assert summarize(flat, MNIST_LIKE, 10).heterogeneity < 0.1 < 0.5 < skewed


def _shares(part: Partition, labels: np.ndarray, clients: slice) -> np.ndarray:
    """Each client's share of each class, [clients, classes]."""
    counts = np.stack([np.bincount(labels[i], minlength=10) for i in part.client_indices])
    return (counts / counts.sum(axis=1, keepdims=True))[clients]


@pytest.mark.parametrize("alpha", [0.3, 1.0, 5.0])
def test_hsu_mixes_follow_their_dirichlet(alpha: float) -> None:
    """Hsu et al.: q_k ~ Dir(alpha p), so a client's share of class c is Beta(alpha
    p_c, alpha (1 - p_c)): mean p_c = 0.1 and variance p_c (1 - p_c) / (alpha + 1)
    (balanced classes). Over the first 100 of 300 clients, before any class runs
    low. Equal sizes; every sample once."""
    labels = np.repeat(np.arange(10), 3000)
    rng = np.random.default_rng(1)
    part = hsu(labels, 300, alpha, rng)
    assert set(part.sizes().tolist()) == {100}
    assert_exact_cover(part, labels.size)
    shares = _shares(part, labels, slice(0, 100))
    want = 0.1 * 0.9 / (alpha + 1)
    assert abs(shares.mean() - 0.1) < 1e-12  # each row sums to 1 over 10 classes
    assert abs(shares.var() / want - 1) < 0.15, (shares.var(), want)
    assert abs(shares[:, 3].mean() - 0.1) < 4 * np.sqrt(want / 100)


def test_hsu_skews_more_than_dirichlet_at_the_same_alpha_and_handles_tiny_alpha() -> None:
    """The two Dirichlet splits at alpha = 1, 100 clients of MNIST-sized classes: a
    client's class share has variance 0.045 (Hsu) against ~0.008 (by class). At
    alpha 1e-300 (alpha p underflows) each client holds one class, and uneven
    class sizes still cover every sample once."""
    labels = np.repeat(np.arange(10), 6000)
    by_client = _shares(hsu(labels, 100, 1.0, np.random.default_rng(2)), labels, slice(0, 50))
    by_class = _shares(dirichlet(labels, 100, 1.0, np.random.default_rng(2)), labels, slice(0, 100))
    assert 0.035 < by_client.var() < 0.055 and by_class.var() < 0.015
    uneven = np.concatenate([np.repeat(np.arange(10), np.arange(1, 11) * 100)])
    tiny = hsu(uneven, 50, 1e-300, np.random.default_rng(3))
    assert_exact_cover(tiny, uneven.size)
    one_class = [np.unique(uneven[i]).size == 1 for i in tiny.client_indices]
    assert sum(one_class) >= 25  # a client straddles classes when its class runs out,
    assert max(np.unique(uneven[i]).size for i in tiny.client_indices) <= 3  # a few only
    with pytest.raises(PartitionError, match="hsu alpha = 0.0"):
        hsu(labels, 10, 0.0, np.random.default_rng(0))
    cfg = PartitionConfig(kind="hsu", alpha=0.5)
    assert make_partition(cfg, 10, labels, 7).sizes().tolist() == [6000] * 10


def test_quantity_sizes() -> None:
    part = quantity_skew(1000, 30, 2.0, np.random.default_rng(0), min_size=10)
    sizes = part.sizes()
    assert sizes.sum() == 1000 and sizes.min() >= 10 and sizes.max() > 3 * np.median(sizes)
    assert_exact_cover(part, 1000)
    equal = quantity_skew(1000, 30, 0.0, np.random.default_rng(5))
    assert set(equal.sizes().tolist()) == {33, 34} and equal.sizes().sum() == 1000
    with pytest.raises(PartitionError, match="sigma"):
        quantity_skew(1000, 30, -0.5, np.random.default_rng(0))
    with pytest.raises(PartitionError, match="min_size"):
        quantity_skew(100, 30, 1.0, np.random.default_rng(0), min_size=4)


@pytest.mark.parametrize("sigma", [500.0, 1e308])
def test_quantity_with_a_huge_sigma_is_still_a_partition(sigma: float) -> None:
    """exp(sigma z) overflows past sigma ~ 200: the weights are taken relative to
    the largest, in log space, instead of becoming inf / inf = NaN (which gave
    negative sizes and overlapping clients)."""
    with np.errstate(invalid="raise", divide="raise"):  # no NaN on the way
        part = quantity_skew(6000, 40, sigma, np.random.default_rng(0), min_size=3)
    sizes = part.sizes()
    assert sizes.sum() == 6000 and sizes.min() >= 3
    assert_exact_cover(part, 6000)


def test_too_many_clients() -> None:
    with pytest.raises(PartitionError, match="num_clients = 11"):
        make_partition(PartitionConfig(), 11, np.arange(10), seed=0)
    with pytest.raises(PartitionError, match="num_clients = 0"):
        make_partition(PartitionConfig(), 0, np.arange(10), seed=0)


def test_partition_is_read_only() -> None:
    part = Partition((np.array([0, 2]), np.array([1])))
    with pytest.raises(ValueError):
        part.client_indices[0][0] = 5
    assert part.sizes().tolist() == [2, 1] and part.num_clients == 2


def test_heterogeneity_hand_worked() -> None:
    # global label mix (3/6, 2/6, 1/6)
    labels = np.array([0, 0, 0, 1, 1, 2])
    part = Partition((np.array([0, 1]), np.array([2, 3, 4]), np.array([5])))
    s = summarize(part, labels, 3)
    assert s.label_counts.tolist() == [[2, 0, 0], [1, 2, 0], [0, 0, 1]]
    assert s.sizes.tolist() == [2, 3, 1]
    # TV: (1,0,0) -> 0.5*(1/2+1/3+1/6) = 1/2; (1/3,2/3,0) -> 0.5*(1/6+1/3+1/6) = 1/3;
    # (0,0,1) -> 0.5*(1/2+1/3+5/6) = 5/6; mean = (1/2+1/3+5/6)/3 = 5/9
    assert s.heterogeneity == pytest.approx(5 / 9, abs=1e-12)
    assert s.labels_per_client().tolist() == [1, 2, 1]
    text = s.format()
    assert "3 clients" in text and "1/2/3" in text and "1.33 labels" in text and "0.556" in text


def test_heterogeneity_iid_vs_shards() -> None:
    h_iid = summarize(make_partition(PartitionConfig("iid"), 100, MNIST_LIKE, 0), MNIST_LIKE, 10)
    h_sh = summarize(make_partition(PartitionConfig("shards"), 100, MNIST_LIKE, 0), MNIST_LIKE, 10)
    assert h_iid.heterogeneity < 0.08  # sampling noise only (about 0.05 at 600 per client)
    # 2 labels at 1/2 each: TV = 0.5*(2*0.4 + 8*0.1) = 0.8; both shards one label: 0.9
    assert 0.8 <= h_sh.heterogeneity <= 0.9
    assert h_sh.labels_per_client().max() <= 2

"""Synthetic(alpha, beta) of FedProx: sizes, feature covariance, labels, the split."""

from __future__ import annotations

import numpy as np

from fedforge.config import from_dict
from fedforge.data.federated import load_federated_data
from fedforge.data.synthetic import feature_variances, generate, train_test_split


def test_sizes_are_lognormal_plus_50_and_deterministic() -> None:
    users = generate(1.0, 1.0, False, 30, np.random.default_rng(7))
    again = generate(1.0, 1.0, False, 30, np.random.default_rng(7))
    assert users.sizes.tolist() == again.sizes.tolist()
    assert (users.sizes >= 50).all() and len(users.sizes) == 30
    # the sizes are the official draw: lognormal(4, 2) cast to int, plus 50
    want = np.random.default_rng(7).lognormal(4, 2, 30).astype(np.int64) + 50
    assert users.sizes.tolist() == want.tolist()
    for x, y in zip(users.xs, users.ys, strict=True):
        assert x.shape == (len(y), 60) and y.min() >= 0 and y.max() <= 9


def test_feature_covariance_diagonal_is_j_to_minus_1_2() -> None:
    users = generate(1.0, 1.0, False, 30, np.random.default_rng(0))
    # within a user, x - v_k ~ N(0, Sigma): pool the centred samples of all users
    centred = np.concatenate([x - x.mean(axis=0) for x in users.xs])
    assert len(centred) > 3000
    cov = np.cov(centred, rowvar=False)
    diag = feature_variances()
    assert diag[0] == 1.0 and np.isclose(diag[59], 60**-1.2)
    np.testing.assert_allclose(np.diag(cov), diag, rtol=0.15)
    off = cov - np.diag(np.diag(cov))
    assert np.abs(off).max() < 0.1  # independent features


def test_iid_variant_shares_one_model_and_feature_law() -> None:
    users = generate(0.0, 0.0, True, 10, np.random.default_rng(1))
    means = np.stack([x.mean(axis=0) for x in users.xs])
    assert np.abs(means[:, 0]).max() < 0.5  # v_k = 0 for every user
    # one W, b for all: the label frequencies agree across users far more than non-IID
    freq = np.stack([np.bincount(y, minlength=10) / len(y) for y in users.ys])
    skewed = generate(1.0, 1.0, False, 10, np.random.default_rng(1))
    freq_skew = np.stack([np.bincount(y, minlength=10) / len(y) for y in skewed.ys])
    assert freq.std(axis=0).mean() < freq_skew.std(axis=0).mean()


def test_iid_features_are_n_0_sigma_whatever_alpha_and_beta() -> None:
    """compare-iid keeps a config's alpha and beta (1, 1): its IID control had
    each user's features shifted by B_k ~ N(0, beta), majority labels at 0.72."""
    users = generate(1.0, 1.0, True, 30, np.random.default_rng(4))
    pooled = np.concatenate(users.xs)
    means = np.stack([x.mean(axis=0) for x in users.xs])
    sizes = users.sizes[:, None]
    # each user's mean of feature j is N(0, Sigma_jj / n_k): standardised, N(0, 1)
    z = means * np.sqrt(sizes / feature_variances())
    assert abs(z.mean()) < 0.1 and 0.85 < z.std() < 1.15
    np.testing.assert_allclose(pooled.var(axis=0), feature_variances(), rtol=0.1)
    same = generate(0.0, 0.0, True, 30, np.random.default_rng(4))
    assert users.sizes.tolist() == same.sizes.tolist()


def test_split_and_config_loading() -> None:
    users = generate(1.0, 1.0, False, 5, np.random.default_rng(2))
    train, test = train_test_split(users, 0.1, np.random.default_rng(3))
    for n, a, b in zip(users.sizes, train.sizes, test.sizes, strict=True):
        assert a == int(0.9 * n) and a + b == n
    cfg = from_dict(
        {"dataset": "synthetic", "model": "logreg", "num_clients": 5, "dtype": "float64"}
    )
    data = load_federated_data(cfg)
    assert data.partition.num_clients == 5 and data.train_x.shape[1] == 60
    assert len(data.train_y) == int(data.partition.sizes().sum())
    assert data.train_x.dtype.is_floating_point and len(data.test_y) > 0

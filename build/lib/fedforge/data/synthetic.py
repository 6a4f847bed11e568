"""Synthetic(alpha, beta) of FedProx (Li et al. 2020, "Federated Optimization in
Heterogeneous Networks", section 5.1 and appendix C.1), following its official
generator (``data/synthetic_*/generate_niid.py`` in litian96/FedProx):

- 60 features, 10 classes, ``num_clients`` users (30 in the paper);
- user k holds lognormal(4, 2) (cast to int) + 50 samples;
- model heterogeneity: u_k ~ N(0, alpha), W_k ~ N(u_k, 1) ``[60, 10]``,
  b_k ~ N(u_k, 1) ``[10]``;
- data heterogeneity: B_k ~ N(0, beta), v_k ~ N(B_k, 1) ``[60]``,
  x ~ N(v_k, Sigma) with Sigma diagonal, Sigma_jj = j^-1.2 (j = 1..60);
- label y = argmax softmax(W_k^T x + b_k) (the official code takes the argmax;
  the paper writes y = argmax(softmax(W x + b)));
- Synthetic-IID (``iid``): one W, b ~ N(0, 1) for every user and x ~ N(0,
  Sigma) for every user (v_k = 0, as the official IID data has): alpha and beta
  play no part (their draws are still taken, so the sizes stay those of the
  non-IID data of the same seed);
- each user's samples are shuffled and split 90% train / 10% test.

alpha and beta are standard deviations. Differences from the official script:
draws come from one derived numpy generator (``fedforge.core.rng``), not the global
one, in the official order per user, and x is drawn as v_k + sqrt(diag) * z
(the same distribution as ``multivariate_normal`` with a diagonal Sigma). The
test set of a run is the union of the users' test splits (the official
evaluation weights users by test size, which is the same accuracy). Runs on the
simulation host, once per run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIMENSION = 60
NUM_CLASSES = 10


@dataclass(frozen=True)
class SyntheticUsers:
    """Each user's samples (float64 features ``[n_k, 60]``, int64 labels ``[n_k]``)."""

    xs: tuple[np.ndarray, ...]
    ys: tuple[np.ndarray, ...]

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(y) for y in self.ys], dtype=np.int64)


def feature_variances(dimension: int = DIMENSION) -> np.ndarray:
    """The diagonal of Sigma: j^-1.2 for j = 1..dimension."""
    return np.power(np.arange(1, dimension + 1, dtype=np.float64), -1.2)


def generate(
    alpha: float,
    beta: float,
    iid: bool,
    num_clients: int,
    rng: np.random.Generator,
    dimension: int = DIMENSION,
    num_classes: int = NUM_CLASSES,
) -> SyntheticUsers:
    """All users' samples of Synthetic(alpha, beta) (or Synthetic-IID)."""
    sizes = rng.lognormal(4, 2, num_clients).astype(np.int64) + 50
    mean_w = rng.normal(0, alpha, num_clients)
    mean_b = mean_w
    shift = rng.normal(0, beta, num_clients)
    std_x = np.sqrt(feature_variances(dimension))
    mean_x = np.zeros((num_clients, dimension))
    for k in range(num_clients):
        if not iid:  # IID: every user's features are N(0, Sigma)
            mean_x[k] = rng.normal(shift[k], 1, dimension)
    if iid:
        w_global = rng.normal(0, 1, (dimension, num_classes))
        b_global = rng.normal(0, 1, num_classes)
    xs, ys = [], []
    for k in range(num_clients):
        w = rng.normal(mean_w[k], 1, (dimension, num_classes))
        b = rng.normal(mean_b[k], 1, num_classes)
        if iid:
            w, b = w_global, b_global
        x = mean_x[k] + std_x * rng.standard_normal((int(sizes[k]), dimension))
        logits = x @ w + b  # argmax of the softmax is the argmax of the logits
        xs.append(x)
        ys.append(np.argmax(logits, axis=1).astype(np.int64))
    return SyntheticUsers(tuple(xs), tuple(ys))


def train_test_split(
    users: SyntheticUsers, test_fraction: float, rng: np.random.Generator
) -> tuple[SyntheticUsers, SyntheticUsers]:
    """Each user's samples shuffled, the first int((1 - test_fraction) n_k) for
    training, the rest for test (the official 90/10 with test_fraction 0.1)."""
    train_x, train_y, test_x, test_y = [], [], [], []
    for x, y in zip(users.xs, users.ys, strict=True):
        perm = rng.permutation(len(y))
        cut = int((1.0 - test_fraction) * len(y))
        train_x.append(x[perm[:cut]])
        train_y.append(y[perm[:cut]])
        test_x.append(x[perm[cut:]])
        test_y.append(y[perm[cut:]])
    return (
        SyntheticUsers(tuple(train_x), tuple(train_y)),
        SyntheticUsers(tuple(test_x), tuple(test_y)),
    )

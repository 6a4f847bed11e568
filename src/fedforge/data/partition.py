"""Partitioners that split a training set over clients: IID and McMahan et al. (2017)
pathological non-IID shards, Dirichlet label skew in its two forms (each class split
over the clients, Yurochkin et al. 2019 and NIID-Bench; each client's class mix drawn,
Hsu et al. 2019), lognormal quantity skew; plus a summary with a heterogeneity figure.

Where it runs: on the simulation host, once per run, before any round. Every function
draws only from the generator it is given, so a seed fixes the partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedforge.config import PartitionConfig
from fedforge.core.errors import PartitionError
from fedforge.core.rng import numpy_rng
from fedforge.data.index_lists import IndexLists

_MAX_DIRICHLET_TRIES = 1000
_HOPELESS_AFTER, _HOPELESS_SHORT = 10, 25  # draws, mean clients short per draw


@dataclass(frozen=True, eq=False)
class Partition:
    """One int64 index array (into the training set) per client, read-only; kept
    as two flat arrays whatever the number of clients (index_lists.py)."""

    client_indices: Sequence[np.ndarray]

    def __post_init__(self) -> None:
        if isinstance(self.client_indices, IndexLists):
            return
        arrays = []
        for client, idx in enumerate(self.client_indices):
            given = np.asarray(idx)
            if given.size and not np.issubdtype(given.dtype, np.integer):
                # a boolean mask or floats would be cast to indices 0/1 or truncated
                raise PartitionError(
                    f"client {client}'s indices are {given.dtype}; they must be integer "
                    "row numbers (np.flatnonzero(mask) turns a boolean mask into them)"
                )
            arrays.append(given.astype(np.int64, copy=False).reshape(-1))
        object.__setattr__(self, "client_indices", IndexLists.of(arrays))  # a private copy

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    def sizes(self) -> np.ndarray:
        """``num_examples`` of each client, int64 ``[num_clients]``."""
        lists = self.client_indices
        assert isinstance(lists, IndexLists)
        return lists.sizes().copy()


def _check_counts(num_samples: int, num_clients: int, min_size: int = 1) -> None:
    if num_clients < 1:
        raise PartitionError(f"num_clients = {num_clients} is invalid: must be >= 1")
    if min_size < 1:
        raise PartitionError(f"partition min_size = {min_size} is invalid: must be >= 1")
    if num_clients * min_size > num_samples:
        raise PartitionError(
            f"cannot give {num_clients} clients at least {min_size} sample(s) each from "
            f"{num_samples} samples: need num_clients * min_size <= num_samples"
        )


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise PartitionError(
            f"labels must be a 1-D integer array, got shape {labels.shape} of {labels.dtype}"
        )
    if labels.size and int(labels.min()) < 0:
        raise PartitionError(f"labels must be >= 0, got minimum {int(labels.min())}")
    return labels


def _split_by_sizes(order: np.ndarray, sizes: np.ndarray) -> Partition:
    """Cut ``order`` into consecutive runs of ``sizes``; each client's indices sorted."""
    parts = np.split(order, np.cumsum(sizes)[:-1])
    return Partition(tuple(np.sort(p) for p in parts))


def iid(num_samples: int, num_clients: int, rng: np.random.Generator) -> Partition:
    """Shuffle, then deal out equal parts (sizes differ by at most 1)."""
    _check_counts(num_samples, num_clients)
    perm = rng.permutation(num_samples)
    return Partition(tuple(np.sort(p) for p in np.array_split(perm, num_clients)))


def shards(
    labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> Partition:
    """McMahan's pathological non-IID split: sort by label (stable), cut into
    ``num_clients * shards_per_client`` equal shards (sizes differ by at most 1), give
    each client ``shards_per_client`` shards drawn at random without replacement.
    On MNIST with 100 clients: 200 shards of 300, two per client."""
    labels = _check_labels(labels)
    _check_counts(labels.size, num_clients)
    if shards_per_client < 1:
        raise PartitionError(f"shards_per_client = {shards_per_client} is invalid: must be >= 1")
    num_shards = num_clients * shards_per_client
    if num_shards > labels.size:
        raise PartitionError(
            f"{num_clients} clients x {shards_per_client} shards_per_client = {num_shards} "
            f"shards, more than the {labels.size} samples; lower shards_per_client or "
            "num_clients"
        )
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, num_shards)
    dealt = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return Partition(tuple(np.sort(np.concatenate([pieces[s] for s in row])) for row in dealt))


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
) -> Partition:
    """Label skew by class (Yurochkin et al. 2019, "Bayesian nonparametric federated
    learning of neural networks"; NIID-Bench, Li et al. 2022): for each class,
    proportions over clients ~ Dir(alpha, ..., alpha), the class's (shuffled) samples
    dealt out in those proportions, so client sizes vary too. Redrawn whole until
    every client has at least ``min_size`` samples (at most 1000 draws). Small alpha:
    each client sees few classes; alpha -> infinity approaches IID. The same alpha
    skews a client's mix much less than :func:`hsu` (MNIST, 100 clients, alpha 1: a
    client's share of a class has variance 0.008 here, 0.045 there)."""
    labels = _check_labels(labels)
    if not (np.isfinite(alpha) and alpha > 0):
        raise PartitionError(f"dirichlet alpha = {alpha} is invalid: must be a number > 0")
    _check_counts(labels.size, num_clients, min_size)
    class_members = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    owner = np.empty(labels.size, dtype=np.int64)
    short = 0  # clients below min_size, summed over the failed draws
    for tries in range(_MAX_DIRICHLET_TRIES):
        if tries == _HOPELESS_AFTER and short / tries > _HOPELESS_SHORT:
            # The short clients per draw are near Poisson: at a mean above 25, no draw
            # of the remaining ones succeeds but with probability ~1000 e^-25 < 1e-7.
            raise PartitionError(
                f"dirichlet partition with alpha = {alpha} leaves on average "
                f"{short / tries:.0f} of the {num_clients} clients with fewer than "
                f"min_size = {min_size} samples per draw ({tries} draws): it cannot "
                "succeed; raise alpha, lower min_size or use fewer clients"
            )
        for members in class_members:
            props = rng.dirichlet(np.full(num_clients, alpha))
            cuts = np.round(np.cumsum(props) * members.size).astype(np.int64)
            cuts[-1] = members.size
            counts = np.diff(cuts, prepend=0)
            owner[rng.permutation(members)] = np.repeat(np.arange(num_clients), counts)
        sizes = np.bincount(owner, minlength=num_clients)
        if sizes.min() >= min_size:
            order = np.argsort(owner, kind="stable")  # by client, indices ascending
            return _split_by_sizes(order, sizes)
        short += int((sizes < min_size).sum())
    raise PartitionError(
        f"dirichlet partition with alpha = {alpha} left some of the {num_clients} clients "
        f"with fewer than min_size = {min_size} samples in {_MAX_DIRICHLET_TRIES} draws; "
        "raise alpha, lower min_size or use fewer clients"
    )


def hsu(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator) -> Partition:
    """Label skew by client (Hsu, Qi and Brown 2019, "Measuring the effects of
    non-identical data distribution for federated visual classification"; the
    split of Reddi et al. 2021's CIFAR-10): client k's class mix q_k ~ Dir(alpha p),
    p the training set's class frequencies, and every client the same number of
    samples (N // K, the first N mod K one more), drawn from q_k out of what is
    left, clients in id order. A class that runs out leaves the mix, which is
    renormalised over the classes left (draws are multinomial, capped at what a
    class has, repeated for the remainder). A client's share of class c then has
    mean p_c and variance p_c (1 - p_c) / (alpha + 1) while no class runs out
    (the last clients take what is left). Small alpha: one class a client."""
    labels = _check_labels(labels)
    if not (np.isfinite(alpha) and alpha > 0):
        raise PartitionError(f"hsu alpha = {alpha} is invalid: must be a number > 0")
    _check_counts(labels.size, num_clients, 1)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    left = np.array([pool.size for pool in pools], dtype=np.int64)
    prior = left / left.sum()
    sizes = np.full(num_clients, labels.size // num_clients, dtype=np.int64)
    sizes[: labels.size % num_clients] += 1
    taken = np.zeros_like(left)
    clients = []
    for size in sizes:
        with np.errstate(invalid="ignore", divide="ignore"):
            mix = rng.dirichlet(alpha * prior)
        if not (np.isfinite(mix).all() and mix.sum() > 0):  # alpha p below float range
            mix = np.eye(left.size)[rng.choice(left.size, p=prior)]  # the alpha -> 0 limit
        counts = np.zeros_like(left)
        need = int(size)
        while need:
            avail = left - counts
            weights = np.where(avail > 0, mix, 0.0)
            if not weights.sum() > 0:  # its classes ran out (the mix underflowed to
                # zero elsewhere): one class of what is left, as the alpha -> 0 limit
                rest = np.where(avail > 0, prior, 0.0)
                weights = np.eye(left.size)[rng.choice(left.size, p=rest / rest.sum())]
            draw = np.minimum(rng.multinomial(need, weights / weights.sum()), avail)
            counts += draw
            need -= int(draw.sum())
        mine = [pool[t : t + n] for pool, t, n in zip(pools, taken, counts, strict=True)]
        clients.append(np.sort(np.concatenate(mine)))
        taken += counts
        left -= counts
    return Partition(tuple(clients))


def quantity_skew(
    num_samples: int,
    num_clients: int,
    sigma: float,
    rng: np.random.Generator,
    min_size: int = 1,
) -> Partition:
    """Quantity skew: client sizes proportional to lognormal(0, sigma) weights.
    Each client first gets ``min_size`` samples; the rest are shared in proportion to
    the weights (largest-remainder rounding, so sizes sum to ``num_samples``). Samples
    are shuffled, so label mixes stay IID. ``sigma = 0`` gives equal sizes."""
    if not (np.isfinite(sigma) and sigma >= 0):
        raise PartitionError(f"quantity sigma = {sigma} is invalid: must be a number >= 0")
    _check_counts(num_samples, num_clients, min_size)
    before = rng.bit_generator.state
    with np.errstate(over="ignore"):
        weights = rng.lognormal(0.0, sigma, num_clients)
    if not np.isfinite(weights.sum()):  # a huge sigma: the same draws, in log space
        rng.bit_generator.state = before
        with np.errstate(over="ignore"):  # sigma * z itself may overflow
            log_weights = np.clip(rng.normal(0.0, sigma, num_clients), -1e300, 1e300)
        weights = np.exp(log_weights - log_weights.max())  # relative to the largest
    spare = num_samples - num_clients * min_size
    exact = weights / weights.sum() * spare
    extra = np.floor(exact).astype(np.int64)
    short = spare - int(extra.sum())
    if short:
        # Largest remainders first; ties go to the lower client id.
        extra[np.argsort(-(exact - extra), kind="stable")[:short]] += 1
    sizes = extra + min_size
    return _split_by_sizes(rng.permutation(num_samples), sizes)


def make_partition(
    cfg: PartitionConfig, num_clients: int, labels: np.ndarray, seed: int
) -> Partition:
    """The partition ``cfg`` describes, drawn from ``numpy_rng(seed, "partition")``."""
    labels = _check_labels(labels)
    if not 1 <= num_clients <= labels.size:
        raise PartitionError(
            f"num_clients = {num_clients} is invalid: must be between 1 and the "
            f"{labels.size} training samples"
        )
    rng = numpy_rng(seed, "partition")
    if cfg.kind == "iid":
        return iid(labels.size, num_clients, rng)
    if cfg.kind == "shards":
        return shards(labels, num_clients, cfg.shards_per_client, rng)
    if cfg.kind == "dirichlet":
        return dirichlet(labels, num_clients, cfg.alpha, rng, cfg.min_size)
    if cfg.kind == "hsu":
        return hsu(labels, num_clients, cfg.alpha, rng)
    if cfg.kind == "quantity":
        return quantity_skew(labels.size, num_clients, cfg.sigma, rng, cfg.min_size)
    raise PartitionError(
        f"partition kind = {cfg.kind!r} is invalid: must be one of "
        "'iid', 'shards', 'dirichlet', 'hsu', 'quantity'"
    )


@dataclass(frozen=True, eq=False)
class PartitionSummary:
    """What a partition looks like.

    ``heterogeneity`` is the mean, over non-empty clients (unweighted), of the total
    variation distance ``0.5 * sum_c |p_client(c) - p_global(c)|`` between a client's
    label distribution and that of all partitioned samples pooled. 0 means every client
    has the global label mix (IID); it approaches 1 when each client holds one rare
    class. McMahan's 2-shard MNIST split gives about 0.8.
    """

    sizes: np.ndarray  # int64 [num_clients]
    label_counts: np.ndarray  # int64 [num_clients, num_classes]
    heterogeneity: float
    domains: tuple[str, ...] | None = None  # feature shift: each client's domain (shift.py)
    noisy_clients: tuple[int, ...] | None = None  # label noise: the noisy ids (noise.py)

    @property
    def num_clients(self) -> int:
        return int(self.sizes.size)

    def labels_per_client(self) -> np.ndarray:
        """How many distinct labels each client holds."""
        return (self.label_counts > 0).sum(axis=1)

    def format(self) -> str:
        """A short human description."""
        if self.num_clients == 0:
            return "0 clients"
        s = self.sizes
        text = (
            f"{self.num_clients} clients; size min/median/max "
            f"{int(s.min())}/{float(np.median(s)):g}/{int(s.max())}"
        )
        if self.label_counts.shape[1] > 1:  # one class a row (not sequences, regression)
            text += (
                f"; {float(self.labels_per_client().mean()):.2f} labels per client on average; "
                f"heterogeneity (mean TV to global label mix) {self.heterogeneity:.3f}"
            )
        if self.domains is not None:
            names = sorted(set(self.domains))
            text += "; domains " + ", ".join(f"{d} x{self.domains.count(d)}" for d in names)
        if self.noisy_clients is not None:
            text += f"; {len(self.noisy_clients)} clients with noisy labels"
        return text


def summarize(
    partition: Partition,
    labels: np.ndarray,
    num_classes: int,
    domains: tuple[str, ...] | None = None,
    noisy_clients: tuple[int, ...] | None = None,
) -> PartitionSummary:
    """Sizes, per-client label histograms (of the labels the clients hold, noisy or
    not) and the heterogeneity figure; ``domains`` and ``noisy_clients`` are kept."""
    labels = _check_labels(labels)
    if labels.size and int(labels.max()) >= num_classes:
        raise PartitionError(f"label {int(labels.max())} does not fit num_classes = {num_classes}")
    counts = np.zeros((partition.num_clients, num_classes), dtype=np.int64)
    for i, idx in enumerate(partition.client_indices):
        counts[i] = np.bincount(labels[idx], minlength=num_classes)
    sizes = partition.sizes()
    total = counts.sum(axis=0)
    nonempty = sizes > 0
    if total.sum() == 0 or not nonempty.any():
        return PartitionSummary(sizes, counts, 0.0, domains, noisy_clients)
    global_p = total / total.sum()
    client_p = counts[nonempty] / sizes[nonempty, None]
    tv = 0.5 * np.abs(client_p - global_p).sum(axis=1)
    return PartitionSummary(sizes, counts, float(tv.mean()), domains, noisy_clients)

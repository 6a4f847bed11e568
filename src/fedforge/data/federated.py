"""A federation's data: a training set split over clients and the held-out test
set, loaded from the config (MNIST, Synthetic, Shakespeare by role, the linear
regression example) and with the partition's feature shift and label noise
applied."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from fedforge.config import Config
from fedforge.core import rows
from fedforge.core.dataspec import DataSpec
from fedforge.core.errors import DataError
from fedforge.core.rng import numpy_rng
from fedforge.data import concept, noise, regression, shakespeare, shift, synthetic
from fedforge.data.mnist import NUM_CLASSES, load_mnist
from fedforge.data.partition import Partition, make_partition
from fedforge.data.tags import Tags, data_tags

# a client id -> the (inputs, labels) that client holds
ClientDataFn = Callable[[int], tuple[torch.Tensor, torch.Tensor]]

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class FederatedData:
    """A training set split over clients, and the held-out test set."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    partition: Partition
    holdout: Partition | None = None  # evaluation.clients: each client's held-out slice
    domains: tuple[str, ...] | None = None  # feature shift: each client's domain
    noisy_clients: tuple[int, ...] | None = None  # label noise: the noisy clients' ids
    concepts: tuple[int, ...] | None = None  # concept shift: each client's label map
    # classes of integer labels (labels lie in [0, num_classes); a sequence's padding
    # is -1). None: taken from the labels (max + 1) when they are integers; float
    # labels are regression targets and have no classes
    num_classes: int | None = None
    # evaluation.validation: the validation rows (indices into the training set)
    validation: np.ndarray | None = None
    # a data source's client tags: attribute -> each client's group (data/tags.py)
    tags: Mapping[str, tuple[str, ...]] | None = None
    # the clients whose rows this copy holds (None: every client's): a deployment
    # server whose clients bring their own data holds none, such a client process
    # its own; the others' index lists are empty
    hosted: tuple[int, ...] | None = None
    # split over clients by the config's partition (load_federated_data); False:
    # the caller's own split, which partition.kind and its fields do not touch
    split_by_config: bool = False

    def classes(self) -> int | None:
        """The number of classes of the labels (None: regression targets)."""
        if self.num_classes is not None:
            return self.num_classes
        if self.train_y.is_floating_point():
            return None
        most = [int(t.max()) for t in (self.train_y, self.test_y) if t.numel()]
        return max(most, default=-1) + 1

    def client_tags(self) -> Tags:
        """Each client's group under every attribute the data carries (tags.py)."""
        clients = len(self.partition.client_indices)
        given = dict(self.tags or {})
        if self.concepts is not None:  # concept shift: each client's label map
            given.setdefault("concept", tuple(f"map{g}" for g in self.concepts))
        return data_tags(clients, self.domains, self.noisy_clients, given)

    def spec(self) -> DataSpec:
        """What a row of this data is: the shapes and dtypes a model reads and predicts."""
        x, y = self.train_x, self.train_y
        return DataSpec(tuple(x.shape[1:]), x.dtype, tuple(y.shape[1:]), self.classes())

    def client_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.tensor(self.partition.client_indices[client_id])
        return rows.take(self.train_x, idx), rows.take(self.train_y, idx)

    def holdout_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's held-out slice (empty without ``evaluation.clients``)."""
        if self.holdout is None:
            return self.train_x[:0], self.train_y[:0]
        idx = torch.tensor(self.holdout.client_indices[client_id], dtype=torch.int64)
        return rows.take(self.train_x, idx), rows.take(self.train_y, idx)

    def validation_data(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The validation rows (None without ``evaluation.validation``)."""
        if self.validation is None:
            return None
        idx = torch.as_tensor(self.validation, dtype=torch.int64)
        return rows.take(self.train_x, idx), rows.take(self.train_y, idx)

    def num_examples(self, client_id: int) -> int:
        return len(self.partition.client_indices[client_id])


def load_federated_data(cfg: Config, train: bool = True) -> FederatedData:
    """The configured data set, cast to the run's dtype and partitioned; ``train``
    False: its test set alone (:func:`test_set_only`; MNIST's training images are
    then never scaled into floats)."""
    if cfg.dataset == "synthetic":
        data = load_synthetic(cfg)
    elif cfg.dataset == "shakespeare":
        data = federated_shakespeare(cfg)
    elif cfg.dataset == "regression":
        data = load_regression(cfg)
    else:
        data = load_mnist_federation(cfg, train)
    if not train:
        return test_set_only(data, cfg.num_clients)
    return dataclasses.replace(data, split_by_config=True)


def test_set_only(data: FederatedData, num_clients: int) -> FederatedData:
    """``data``'s test set, with no client's rows (``hosted`` empty): what a
    deployment server holds whose clients bring their own data."""
    empty = np.zeros(0, dtype=np.int64)
    x, y = data.test_x, data.test_y
    return FederatedData(
        x[:0], y[:0], x, y, Partition((empty,) * num_clients), num_classes=data.classes(), hosted=()
    )


def load_mnist_federation(cfg: Config, train: bool = True) -> FederatedData:
    """MNIST in the run's dtype, partitioned by ``cfg.partition`` (``train``
    False: with no training rows, for :func:`test_set_only`)."""
    mnist = load_mnist(cfg.data_dir, scaling=cfg.input_scaling, train=train)
    dtype = DTYPES[cfg.dtype]
    partition = Partition(())
    if train:
        labels = mnist.train_y.numpy()
        partition = make_partition(cfg.partition, cfg.num_clients, labels, cfg.seed)
    return FederatedData(
        mnist.train_x.to(dtype),
        mnist.train_y,
        mnist.test_x.to(dtype),
        mnist.test_y,
        partition,
        num_classes=NUM_CLASSES,
    )


def load_synthetic(cfg: Config) -> FederatedData:
    """Synthetic(alpha, beta) of FedProx (``cfg.synthetic``), one user a client, in
    the generator's own partition (``cfg.partition`` does not apply)."""
    syn = cfg.synthetic
    users = synthetic.generate(
        syn.alpha, syn.beta, syn.iid, cfg.num_clients, numpy_rng(cfg.seed, "synthetic")
    )
    split = numpy_rng(cfg.seed, "synthetic-split")
    train, test = synthetic.train_test_split(users, syn.test_fraction, split)
    dtype = DTYPES[cfg.dtype]
    bounds = np.cumsum([0, *train.sizes.tolist()])
    parts = tuple(np.arange(bounds[k], bounds[k + 1]) for k in range(cfg.num_clients))
    return FederatedData(
        torch.from_numpy(np.concatenate(train.xs)).to(dtype),
        torch.from_numpy(np.concatenate(train.ys)),
        torch.from_numpy(np.concatenate(test.xs)).to(dtype),
        torch.from_numpy(np.concatenate(test.ys)),
        Partition(parts),
        num_classes=synthetic.NUM_CLASSES,
    )


def federated_shakespeare(cfg: Config) -> FederatedData:
    """Shakespeare by speaking role (data/shakespeare.py): ``partition.kind:
    natural`` keeps one client a role that has a training window, ``iid`` deals the
    same windows evenly over ``num_clients`` (the IID control). The test set holds
    every role's test windows."""
    data = shakespeare.load_shakespeare(cfg.data_dir)
    keep = [p for p in data.partition.client_indices if len(p)]  # roles that train
    if cfg.partition.kind == "natural":
        if cfg.num_clients != len(keep):
            raise DataError(
                f"num_clients = {cfg.num_clients} does not fit partition 'natural' of "
                f"Shakespeare: {len(keep)} of its {len(data.roles)} roles have a training "
                f"window (set num_clients: {len(keep)})"
            )
        partition = Partition(tuple(keep))
    else:
        labels = np.zeros(len(data.train_y), dtype=np.int64)  # iid needs no classes
        partition = make_partition(cfg.partition, cfg.num_clients, labels, cfg.seed)
    return FederatedData(
        data.train_x,
        data.train_y,
        data.test_x,
        data.test_y,
        partition,
        num_classes=len(data.vocab),
    )


def load_regression(cfg: Config) -> FederatedData:
    """The linear regression example (data/regression.py), its rows dealt by
    ``cfg.partition`` (iid or quantity)."""
    data = regression.generate(cfg.num_clients, cfg.seed)
    labels = np.zeros(len(data.train_y), dtype=np.int64)
    partition = make_partition(cfg.partition, cfg.num_clients, labels, cfg.seed)
    dtype = DTYPES[cfg.dtype]
    return FederatedData(
        data.train_x.to(dtype),
        data.train_y.to(dtype),
        data.test_x.to(dtype),
        data.test_y.to(dtype),
        partition,
    )


def shift_data(cfg: Config, data: FederatedData) -> FederatedData:
    """``data`` with the clients' feature-shift domains, label noise and concept
    shift of ``cfg.partition`` applied to their examples (each once: data that already
    carries its domains or noisy clients keeps them)."""
    part = cfg.partition
    if part.feature_shift and data.domains is None:
        domains = shift.assign_domains(cfg.num_clients, part.feature_shift, cfg.seed)
        train_x = shift.shift_features(data.train_x, data.partition, domains, cfg.seed)
        data = dataclasses.replace(data, train_x=train_x, domains=domains)
    if part.label_noise > 0 and data.noisy_clients is None:
        noisy = noise.noisy_client_ids(cfg.num_clients, part.label_noise, cfg.seed)
        train_y = noise.noisy_labels(
            data.train_y,
            data.partition,
            noisy,
            part.label_noise_rule,
            part.label_noise_rate,
            data.classes() or NUM_CLASSES,
            cfg.seed,
        )
        data = dataclasses.replace(data, train_y=train_y, noisy_clients=noisy)
    if part.concept_shift and data.concepts is None:
        groups = concept.assign_groups(cfg.num_clients, part.concept_shift, cfg.seed)
        maps = concept.label_maps(part.concept_shift, data.classes() or NUM_CLASSES, cfg.seed)
        train_y = concept.relabel(data.train_y, data.partition, groups, maps)
        data = dataclasses.replace(data, train_y=train_y, concepts=groups)
    return data

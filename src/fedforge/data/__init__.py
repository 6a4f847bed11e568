"""Data sets (MNIST) and the partitioners that split a training set over clients."""

from fedforge.data.mnist import (
    MIRRORS,
    MNIST_FILES,
    MnistData,
    download,
    load_mnist,
    parse_idx,
    resolve_cache_dir,
    resolve_data_dir,
)
from fedforge.data.partition import (
    Partition,
    PartitionSummary,
    dirichlet,
    iid,
    make_partition,
    quantity_skew,
    shards,
    summarize,
)

__all__ = [
    "MIRRORS",
    "MNIST_FILES",
    "MnistData",
    "Partition",
    "PartitionSummary",
    "dirichlet",
    "download",
    "iid",
    "load_mnist",
    "make_partition",
    "parse_idx",
    "quantity_skew",
    "resolve_cache_dir",
    "resolve_data_dir",
    "shards",
    "summarize",
]

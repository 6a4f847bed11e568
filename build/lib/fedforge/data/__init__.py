"""Data sets (MNIST), the partitioners that split a training set over clients, and
the constructors of a federation from the caller's own data."""

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
from fedforge.data.partition_table import load_partition_table
from fedforge.data.user import from_datasets, from_tensors

__all__ = [
    "MIRRORS",
    "MNIST_FILES",
    "MnistData",
    "Partition",
    "PartitionSummary",
    "dirichlet",
    "download",
    "from_datasets",
    "from_tensors",
    "iid",
    "load_mnist",
    "load_partition_table",
    "make_partition",
    "parse_idx",
    "quantity_skew",
    "resolve_cache_dir",
    "resolve_data_dir",
    "shards",
    "summarize",
]

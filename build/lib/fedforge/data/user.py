"""The caller's own data as a federation: tensors or torchvision-style datasets
plus a partition, checked and turned into :class:`FederatedData` for
``run(cfg, data=...)``.

A partition is given in one of three forms:

- a client-id column: one id per training row (a 1-D list, array or tensor);
  ids must run 0..K-1 with every client holding a row, and client k's rows are
  the rows holding k, ascending;
- one index list per client (a sequence of lists, arrays or tensors, or a 2-D
  array with a row per client): client k's rows of ``train_x``, in the order
  given; rows left out belong to no client;
- a :class:`Partition` (e.g. from :func:`load_partition_table`), checked like
  index lists.

Features keep an integer dtype (token ids, say); floating features are cast to
``dtype``, which should be the run's config dtype (the run refuses features of
another). Integer labels are class ids (int64); floating labels are regression
targets, which have no classes, also cast to ``dtype``.

Where it runs: on the simulation host, once, before a run. What it trusts:
nothing; every error is one line naming the argument, and the row or value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from fedforge.core.errors import DataError, shown
from fedforge.data.federated import FederatedData
from fedforge.data.partition import Partition
from fedforge.data.partition_table import first_repeat, group_rows

# a client-id column, one index list per client, or a Partition (module docstring)
PartitionLike = Partition | np.ndarray | torch.Tensor | Sequence[Any]


class ItemDataset(Protocol):
    """A map-style dataset (torchvision's): item ``i`` is a pair ``(x, y)``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


def from_tensors(
    train_x: torch.Tensor | np.ndarray,
    train_y: torch.Tensor | np.ndarray,
    test_x: torch.Tensor | np.ndarray,
    test_y: torch.Tensor | np.ndarray,
    partition: PartitionLike,
    num_classes: int | None = None,
    *,
    dtype: torch.dtype | None = torch.float32,
) -> FederatedData:
    """A federation of the rows of ``train_x``/``train_y`` split by ``partition``
    and evaluated on ``test_x``/``test_y``. ``num_classes``: labels then lie in
    0..num_classes-1 (None: taken from the labels, or regression targets when
    they are floats). ``dtype``: floating features and targets are cast to it
    (None: kept as they are)."""
    _check_dtype(dtype)
    if num_classes is not None and (
        isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
    ):
        raise DataError(f"num_classes = {shown(num_classes)} is invalid: must be an integer >= 1")
    train_x, test_x = _features(train_x, "train_x", dtype), _features(test_x, "test_x", dtype)
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(
            f"test_x rows have shape {tuple(test_x.shape[1:])}; train_x rows have "
            f"{tuple(train_x.shape[1:])}"
        )
    if train_x.dtype != test_x.dtype:
        raise DataError(f"test_x is {test_x.dtype} but train_x is {train_x.dtype}")
    train_y = _labels(train_y, "train_y", len(train_x), "train_x", num_classes, dtype)
    test_y = _labels(test_y, "test_y", len(test_x), "test_x", num_classes, dtype)
    if train_y.is_floating_point() != test_y.is_floating_point():
        kinds = {True: "float regression targets", False: "integer class ids"}
        raise DataError(
            f"test_y is {test_y.dtype} but train_y holds {kinds[train_y.is_floating_point()]}: "
            "both must be integers or both floats"
        )
    return FederatedData(
        train_x,
        train_y,
        test_x,
        test_y,
        _partition(partition, len(train_x)),
        num_classes=num_classes,
    )


def from_datasets(
    train_dataset: ItemDataset,
    test_dataset: ItemDataset,
    partition: PartitionLike,
    num_classes: int | None = None,
    *,
    dtype: torch.dtype | None = torch.float32,
) -> FederatedData:
    """:func:`from_tensors` on the items of two datasets stacked into tensors
    (row i of the training set: ``train_dataset[i]``). Floating features and
    targets are stacked as ``dtype`` (None: float32), integer features keep
    their dtype (convert uint8 images in the dataset's transform), integer
    labels become int64."""
    _check_dtype(dtype)
    floats = dtype or torch.float32
    train_x, train_y = _stack_items(train_dataset, "train_dataset", floats)
    test_x, test_y = _stack_items(test_dataset, "test_dataset", floats)
    return from_tensors(train_x, train_y, test_x, test_y, partition, num_classes, dtype=dtype)


def _check_dtype(dtype: torch.dtype | None) -> None:
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise DataError(
            f"dtype = {shown(dtype)} is not a floating torch dtype; pass the config's "
            "(torch.float32, torch.float64) or None to keep the features' own"
        )


def _as_array(value: object, what: str) -> np.ndarray:
    """``value`` (a tensor, array, number or nested list of numbers) as an array."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # e.g. ragged nested lists
        raise DataError(f"{what} = {shown(value)} is not an array of numbers: {exc}") from None
    if array.dtype.kind not in "biufc":
        raise DataError(f"{what} = {shown(value)} is not a number or array of numbers")
    return array


def _as_tensor(value: object, what: str) -> torch.Tensor:
    """``value`` (a tensor, array, number or nested list of numbers) as a tensor."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    array = _as_array(value, what)
    if not (array.flags.writeable and array.flags.c_contiguous):  # e.g. a memory map
        array = array.copy()
    return torch.from_numpy(array)


def _stack_items(
    dataset: ItemDataset, what: str, floats: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every item's x and y stacked along a new first dimension; floating ones as
    ``floats``, integer ones in their common dtype (labels int64)."""
    try:
        size = len(dataset)
    except TypeError:
        raise DataError(f"{what} has no len(); a map-style dataset is needed") from None
    if size == 0:
        raise DataError(f"{what} is empty")
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    for i in range(size):
        item = dataset[i]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise DataError(f"{what}[{i}] is {shown(item)}; each item must be a pair (x, y)")
        x, y = _as_tensor(item[0], f"{what}[{i}]'s x"), _as_tensor(item[1], f"{what}[{i}]'s y")
        for name, got, seen in (("x", x, xs), ("y", y, ys)):
            if seen and got.shape != seen[0].shape:
                raise DataError(
                    f"{what}[{i}]'s {name} has shape {tuple(got.shape)}; item 0's "
                    f"{name} has {tuple(seen[0].shape)}: every item must have the same"
                )
            seen.append(got)
    return _stack(xs, floats, keep_integers=True), _stack(ys, floats, keep_integers=False)


def _stack(items: list[torch.Tensor], floats: torch.dtype, keep_integers: bool) -> torch.Tensor:
    """The items as one tensor: floats as ``floats``; integers in their common
    dtype (``keep_integers``) or int64; bool and complex left for the checks."""
    common = items[0].dtype
    for item in items[1:]:
        common = torch.promote_types(common, item.dtype)
    if common.is_floating_point:
        common = floats
    elif not keep_integers and not (common == torch.bool or common.is_complex):
        common = torch.int64  # labels: class ids (a bool or complex is refused later)
    return torch.stack([item.to(common) for item in items])


def _features(x: object, what: str, dtype: torch.dtype | None) -> torch.Tensor:
    """``x`` as a tensor of one row per example, floating ones in ``dtype``."""
    if not isinstance(x, (torch.Tensor, np.ndarray)):
        raise DataError(f"{what} is {type(x).__name__}; pass a torch.Tensor or numpy array")
    tensor = _as_tensor(x, what)
    if tensor.dim() == 0:
        raise DataError(f"{what} is a single number; it needs a row per example")
    if tensor.is_complex():
        raise DataError(f"{what} is {tensor.dtype}; features must be real (floats or integers)")
    if tensor.is_floating_point() and dtype is not None:
        tensor = tensor.to(dtype)
    return tensor


def _labels(
    y: object,
    what: str,
    rows: int,
    x_name: str,
    num_classes: int | None,
    dtype: torch.dtype | None,
) -> torch.Tensor:
    """``y`` checked: one label per row of ``x_name``, integer class ids (int64)
    in range, or float regression targets (in ``dtype``) when no classes are
    declared. A label of more than one dimension (a sequence's, one a position)
    may hold -1, a sequence's padding (as FederatedData documents)."""
    if not isinstance(y, (torch.Tensor, np.ndarray)):
        raise DataError(f"{what} is {type(y).__name__}; pass a torch.Tensor or numpy array")
    labels = _as_tensor(y, what)
    if labels.dim() == 0 or len(labels) != rows:
        got = "a single number" if labels.dim() == 0 else f"{len(labels)} rows"
        raise DataError(f"{x_name} has {rows} rows but {what} has {got}: one label a row")
    if labels.dtype == torch.bool or labels.is_complex():
        raise DataError(
            f"{what} is {labels.dtype}; labels must be integer class ids (or float "
            "regression targets)"
        )
    if labels.is_floating_point():
        if num_classes is not None:
            raise DataError(
                f"{what} is {labels.dtype} but num_classes = {num_classes} is given: class "
                "labels must be integers (y.long()); float labels are regression targets "
                "(num_classes=None)"
            )
        return labels.to(dtype) if dtype is not None else labels
    labels = labels.to(torch.int64)
    _check_classes(labels, what, num_classes)
    return labels


def _check_classes(labels: torch.Tensor, what: str, num_classes: int | None) -> None:
    """Refuse a class id outside 0..num_classes-1 (-1 padding allowed in
    sequence labels), naming the first one and its row."""
    lowest = -1 if labels.dim() > 1 else 0
    flat = labels.reshape(-1)
    bad = flat < lowest
    if num_classes is not None:
        bad |= flat >= num_classes
    if not bool(bad.any()):
        return
    at = int(torch.nonzero(bad)[0, 0])
    row = at // max(1, flat.numel() // len(labels))
    padding = " (and -1, padding)" if lowest < 0 else ""
    allowed = (
        f"num_classes = {num_classes} allows 0..{num_classes - 1}{padding}"
        if num_classes is not None
        else f"class ids are 0 or more{padding}"
    )
    raise DataError(f"{what}[{row}] holds class {int(flat[at])}; {allowed}")


def _partition(partition: PartitionLike, rows: int) -> Partition:
    """``partition`` in any of its forms (module docstring) as a checked Partition."""
    if isinstance(partition, Partition):
        return _from_index_lists(list(partition.client_indices), rows)
    if isinstance(partition, (torch.Tensor, np.ndarray)):
        if isinstance(partition, np.ndarray) and partition.dtype == object:
            return _from_index_lists(list(partition), rows)  # ragged: an array of arrays
        array = _as_array(partition, "partition")
        if array.ndim == 2 and array.size:  # a row of indices per client
            return _from_index_lists(list(array), rows)
        if array.ndim != 1:
            raise DataError(
                f"partition has shape {array.shape}; give a 1-D client-id column (one id "
                "a row of train_x) or one index list per client"
            )
        return _from_client_ids(array, rows)
    if isinstance(partition, (str, bytes)) or not isinstance(partition, Sequence):
        raise DataError(
            f"partition is {type(partition).__name__}; give a client-id column, one index "
            "list per client, or a Partition"
        )
    if len(partition) == 0:
        raise DataError("partition is empty: it gives no row to any client")
    scalar = [_is_scalar(item) for item in partition]
    if all(scalar):
        return _from_client_ids(np.asarray([_scalar(p) for p in partition]), rows)
    if any(scalar):
        i = scalar.index(not scalar[0])
        raise DataError(
            f"partition mixes client ids and index lists (item 0 is {shown(partition[0])}, "
            f"item {i} is {shown(partition[i])}); give one form"
        )
    return _from_index_lists(list(partition), rows)


def _is_scalar(item: object) -> bool:
    if isinstance(item, (torch.Tensor, np.ndarray)):
        return item.ndim == 0
    return isinstance(item, (int, float, complex, np.generic))


def _scalar(item: object) -> object:
    return item.item() if isinstance(item, (torch.Tensor, np.ndarray, np.generic)) else item


def _from_client_ids(ids: np.ndarray, rows: int) -> Partition:
    """Client k: the rows whose id is k, ascending."""
    if len(ids) != rows:
        raise DataError(
            f"partition: the client-id column has {len(ids)} entries; train_x has {rows} "
            "rows (one client id a row)"
        )
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        first = 0  # the row named: the first fractional id, if any
        if ids.dtype.kind == "f":
            with np.errstate(invalid="ignore"):  # inf % 1 is nan: fractional too
                fractional = np.flatnonzero(~np.isfinite(ids) | (ids % 1 != 0))
            first = int(fractional[0]) if fractional.size else 0
        raise DataError(
            f"partition: client ids are {ids.dtype} (row {first}: {shown(_scalar(ids[first]))}); "
            "they must be integers 0..K-1"
        )
    return group_rows(
        np.arange(rows, dtype=np.int64), ids.astype(np.int64), rows, "partition",
        lambda i: f"row {i}",
    )  # fmt: skip


def _from_index_lists(lists: list[Any], rows: int) -> Partition:
    """Client k: the rows of ``lists[k]``, in the order given."""
    arrays = []
    for k, idx in enumerate(lists):
        index = _as_array(idx, f"partition[{k}]")
        if index.ndim != 1:
            raise DataError(
                f"partition[{k}]: client {k}'s indices have shape {index.shape}; they must "
                "be 1-D row numbers"
            )
        if index.size == 0:
            raise DataError(f"partition: client {k} has no rows; every client needs one")
        if index.dtype == bool or not np.issubdtype(index.dtype, np.integer):
            raise DataError(
                f"partition[{k}]: client {k}'s indices are {index.dtype}; they must be integer "
                "row numbers of train_x (np.flatnonzero(mask) for a boolean mask)"
            )
        outside = np.flatnonzero((index < 0) | (index >= rows))
        if outside.size:
            raise DataError(
                f"partition[{k}]: client {k}'s index {int(index[outside[0]])} is outside "
                f"train_x's rows 0..{rows - 1}"
            )
        arrays.append(index.astype(np.int64))
    every = np.concatenate(arrays)
    repeat = first_repeat(every)
    if repeat is not None:
        owner = np.repeat(np.arange(len(arrays)), [a.size for a in arrays])
        i, j = repeat
        a, b = int(owner[i]), int(owner[j])
        who = f"client {a} twice" if a == b else f"clients {a} and {b}"
        raise DataError(
            f"partition: row {int(every[j])} is given to {who}; give each row to one client once"
        )
    return Partition(tuple(arrays))

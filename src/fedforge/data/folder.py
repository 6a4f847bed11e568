"""A client's own examples in a folder, for ``fedforge client --data PATH``:

- ``PATH/train.npz`` (required): arrays ``x``, one row per example, and ``y``,
  one label a row; the client trains on them and declares their count.
- ``PATH/test.npz`` (optional): the same two arrays, the client's held-out
  examples: the cold start and canary evaluations score them (without it, the
  training examples).

Which folder: with one id (``--client-id 5``) ``PATH`` is the client's own
folder; with several (``--client-id 0-24``: a site hosting its devices' data)
``PATH`` holds one such folder per client, ``PATH/<id>/``. The rule goes by the
count of ids alone; a folder laid out the other way is refused with the
``--data`` that reads it.

Written with ``np.savez(PATH / "train.npz", x=x, y=y)``. The rows must be what
the federation's model reads (the server's :class:`DataSpec`): ``x`` of the
input shape, floats (cast to the run's dtype, already scaled as the federation
scales its inputs) or integers for token ids; ``y`` class ids in
``0..num_classes - 1`` (-1: a sequence step's padding) or float regression
targets of the label shape.

Where it runs: on the client, once, before it joins. What it trusts: nothing in
the files; every error is one line naming the file, the array and the value.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedforge.core.dataspec import DataSpec
from fedforge.core.errors import DataError
from fedforge.data.federated import FederatedData
from fedforge.data.given import check_classes
from fedforge.data.partition import Partition

ARRAYS = ("x", "y")
TRAIN, TEST = "train.npz", "test.npz"
# what numpy raises on a file that is not an .npz of plain arrays: not a zip, a
# truncated or corrupted one (a bad CRC, broken deflate data), a compression it
# cannot read, a pickled (object) array
UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError)


@dataclass(frozen=True)
class Examples:
    """The two arrays of one file, and the file."""

    x: np.ndarray
    y: np.ndarray
    path: Path


@dataclass(frozen=True)
class ClientFolder:
    """A client's training examples and, when it has them, held-out ones."""

    train: Examples
    test: Examples | None

    @property
    def num_examples(self) -> int:
        return len(self.train.y)


def read_folder(path: str | Path) -> ClientFolder:
    """The folder's files, read and checked for form (DataError: missing,
    unreadable, an array missing or extra, ``x`` and ``y`` of different rows)."""
    folder = Path(path)
    if not folder.is_dir():
        raise DataError(f"--data {folder}: no such folder (it holds {TRAIN}, and {TEST} if any)")
    if not (folder / TRAIN).is_file():
        raise DataError(f"{folder / TRAIN}: no such file; the folder needs {TRAIN} (x, y)")
    train = _read(folder / TRAIN)
    if len(train.y) == 0:
        raise DataError(f"{train.path}: no examples (x has 0 rows); a client needs at least one")
    test = _read(folder / TEST) if (folder / TEST).is_file() else None
    return ClientFolder(train, test)


def _read(path: Path) -> Examples:
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise DataError(
                f"{path}: a single array (.npy), not an .npz file of arrays x and y "
                "(write it with np.savez(path, x=x, y=y))"
            )
        with loaded as npz:
            names = sorted(npz.files)
            if names != sorted(ARRAYS):
                raise DataError(
                    f"{path}: holds arrays {', '.join(names) or 'none'}; it must hold exactly "
                    "x (the inputs) and y (the labels)"
                )
            x, y = npz["x"], npz["y"]
    except UNREADABLE as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{path}: not a readable .npz file of arrays x and y ({first})") from None
    for name, a in (("x", x), ("y", y)):
        if a.ndim == 0:
            raise DataError(f"{path}: array {name} is a single number; it needs a row per example")
    if len(x) != len(y):
        raise DataError(
            f"{path}: array x has {len(x)} rows but array y has {len(y)}; one label a row"
        )
    return Examples(x, y, path)


def fit_spec(ex: Examples, spec: DataSpec, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``ex`` as tensors a model of ``spec`` trains on (floats in ``dtype``), or
    DataError naming the file, the array and what the federation needs."""
    x, y, at = ex.x, ex.y, ex.path
    if tuple(x.shape[1:]) != spec.input_shape:
        raise DataError(
            f"{at}: array x rows have shape {tuple(x.shape[1:])}; the federation's inputs "
            f"have {spec.input_shape}"
        )
    floats = spec.input_dtype.is_floating_point
    if x.dtype.kind not in ("f" if floats else "iu"):
        need = "floats (scaled as the federation scales its inputs)" if floats else "integers"
        raise DataError(f"{at}: array x is {x.dtype}; the federation's inputs are {need}")
    if tuple(y.shape[1:]) != spec.label_shape:
        raise DataError(
            f"{at}: array y rows have shape {tuple(y.shape[1:])}; the federation's labels "
            f"have {spec.label_shape}"
        )
    if spec.num_classes is None:
        if y.dtype.kind != "f":
            raise DataError(
                f"{at}: array y is {y.dtype}; the federation's labels are float targets"
            )
        labels = torch.from_numpy(_native(y)).to(dtype)
        _check_finite(at, "y", y, labels)
    else:
        if y.dtype.kind not in "iu":
            raise DataError(
                f"{at}: array y is {y.dtype}; the federation's labels are integer class ids "
                f"0..{spec.num_classes - 1}"
            )
        check_classes(f"{at}: array y", y, spec.num_classes)  # before the cast: uint64 too
        labels = torch.from_numpy(y.astype(np.int64))
    inputs = torch.from_numpy(_native(x)).to(dtype if floats else spec.input_dtype)
    if floats:
        _check_finite(at, "x", x, inputs)
    return inputs, labels


def _native(a: np.ndarray) -> np.ndarray:
    """``a`` contiguous in the machine's byte order (torch reads no other)."""
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("="))


def _check_finite(at: Path, name: str, stored: np.ndarray, cast: torch.Tensor) -> None:
    """DataError when array ``name``, ``stored`` as the file holds it and ``cast``
    to the run's dtype, holds a NaN or an infinity: one of the file's, or a
    number too large for the dtype."""
    bad = ~torch.isfinite(cast)
    if not bad.any():
        return
    at_bad = tuple(int(i) for i in torch.nonzero(bad)[0])
    value = stored[at_bad]
    if np.isfinite(value):
        dtype = str(cast.dtype).removeprefix("torch.")
        what = f"{float(value):g}, beyond the range of the run's {dtype}"
    else:
        what = "a NaN or infinite value"
    raise DataError(f"{at}: array {name} holds {what} (row {at_bad[0]})")


def read_folders(path: str | Path, ids: Sequence[int]) -> dict[int, ClientFolder]:
    """The folders of the clients ``ids`` a process hosts: ``path`` itself for
    one client, ``path/<id>/`` each for several (a site with its devices' data)."""
    root = Path(path)
    if len(ids) == 1:
        own = root / str(ids[0])
        if not (root / TRAIN).is_file() and (own / TRAIN).is_file():
            raise DataError(
                f"--data {root}: no {TRAIN}; with one --client-id the folder is the "
                f"client's own: --data {own}"
            )
        return {ids[0]: read_folder(root)}
    if not root.is_dir():
        raise DataError(f"--data {root}: no such folder (it holds a folder <id>/ per client)")
    if (root / TRAIN).is_file() and not any((root / str(k)).is_dir() for k in ids):
        raise DataError(
            f"--data {root}: one client's folder ({TRAIN}); with several --client-id ids it "
            f"holds a folder <id>/ per client ({root / str(ids[0]) / TRAIN}, ...)"
        )
    return {k: read_folder(root / str(k)) for k in ids}


def own_data(
    folders: Mapping[int, ClientFolder], spec: DataSpec, dtype: torch.dtype, num_clients: int
) -> FederatedData:
    """A federation's data as a process hosting ``folders``' clients holds it: their
    rows (checked against ``spec``), every other client's held elsewhere. A
    client's ``test.npz`` rows are its held-out slice (``holdout``: rows of
    ``train_x`` outside the partition, as ``evaluation.clients`` carves them)."""
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    empty = np.zeros(0, dtype=np.int64)
    train = [empty] * num_clients
    held = [empty] * num_clients
    for k, folder in folders.items():
        for slices, ex in ((train, folder.train), (held, folder.test)):
            if ex is None:
                continue
            x, y = fit_spec(ex, spec, dtype)
            start = sum(len(t) for t in ys)
            slices[k] = np.arange(start, start + len(y))
            xs.append(x)
            ys.append(y)
    train_x, train_y = torch.cat(xs), torch.cat(ys)
    return FederatedData(
        train_x,
        train_y,
        train_x[:0],
        train_y[:0],
        Partition(tuple(train)),
        holdout=Partition(tuple(held)),
        num_classes=spec.num_classes,
        hosted=tuple(sorted(folders)),
    )

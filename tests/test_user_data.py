"""The caller's own data as a federation: tensors, datasets and partition tables
give the clients computed here by hand, every form of a partition gives the same
one, bad input is refused in one line naming the field and value, and a small
data set of the caller's trains to a good accuracy through run()."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import fedforge as ff
from fedforge.core.errors import DataError
from fedforge.data import Partition, from_datasets, from_tensors, load_partition_table
from fedforge.data.federated import FederatedData
from fedforge.models import MODELS

# Six training rows over three clients, as a table (shuffled lines, columns in
# the other order, a blank line) and by hand: client k holds the rows listed
# with k, ascending.
TABLE = "client_id,row\n1,5\n0,2\n1,0\n\n2,3\n0,4\n2,1\n"
CLIENTS = [[2, 4], [0, 5], [1, 3]]
IDS = [1, 2, 0, 2, 0, 1]  # row r's client, the same split as a column

X = torch.arange(24, dtype=torch.float64).reshape(6, 4)
Y = torch.tensor([0, 1, 2, 0, 1, 2])
TX, TY = torch.ones(2, 4, dtype=torch.float64), torch.tensor([2, 0])


def _indices(part: Partition) -> list[list[int]]:
    return [idx.tolist() for idx in part.client_indices]


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_csv_table_gives_the_clients_listed_with_rows_ascending(tmp_path: Path) -> None:
    part = load_partition_table(_write(tmp_path, TABLE), num_rows=6)
    assert _indices(part) == CLIENTS
    spaced = "Row , CLIENT_ID\n5, 1\n0,1\n2,0\n4,0\n3,2\n1,2\n"  # names and values trimmed
    assert _indices(load_partition_table(_write(tmp_path, spaced, "s.csv"))) == CLIENTS


def test_every_form_of_a_partition_gives_the_same_clients(tmp_path: Path) -> None:
    table = load_partition_table(_write(tmp_path, TABLE))
    forms: list[Any] = [
        IDS,
        np.array(IDS, dtype=np.int32),
        torch.tensor(IDS),
        [torch.tensor(i) for i in IDS],  # 0-d tensors
        CLIENTS,
        [np.array(c) for c in CLIENTS],
        np.array(CLIENTS),  # a row of indices per client
        table,
    ]
    for form in forms:
        data = from_tensors(X, Y, TX, TY, form)
        assert _indices(data.partition) == CLIENTS, form
        assert data.client_data(1)[1].tolist() == [Y[0].item(), Y[5].item()]
    given_order = from_tensors(X, Y, TX, TY, [[4, 2], [5, 0], [3, 1]])  # kept as given
    assert _indices(given_order.partition) == [[4, 2], [5, 0], [3, 1]]
    some_rows = from_tensors(X, Y, TX, TY, [[0], [3]])  # rows 1, 2, 4, 5: no client's
    assert _indices(some_rows.partition) == [[0], [3]]


def test_dtypes_floats_are_cast_integers_kept() -> None:
    data = from_tensors(X, Y.int(), TX, TY.to(torch.uint8), IDS, num_classes=3)
    assert data.train_x.dtype == data.test_x.dtype == torch.float32  # the default dtype
    assert data.train_y.dtype == data.test_y.dtype == torch.int64
    assert torch.equal(data.train_x, X.float()) and data.classes() == 3
    assert from_tensors(X, Y, TX, TY, IDS, dtype=torch.float64).train_x.dtype == torch.float64
    assert from_tensors(X.half(), Y, TX.half(), TY, IDS, dtype=None).train_x.dtype == torch.float16
    tokens = torch.randint(0, 65, (6, 80), dtype=torch.int32)
    seq = from_tensors(tokens, Y, tokens[:2], TY, IDS)  # token ids stay integers
    assert seq.train_x.dtype == torch.int32 and torch.equal(seq.train_x, tokens)
    targets = from_tensors(X, Y.double() / 2, TX, TY.double(), IDS)  # regression targets
    assert targets.train_y.dtype == torch.float32 and targets.classes() is None
    assert from_tensors(X.numpy(), Y.numpy(), TX.numpy(), TY.numpy(), IDS).train_x.dtype == (
        torch.float32
    )
    padded = torch.tensor([[0, 1], [2, -1], [1, 1], [0, 0], [2, 2], [1, -1]])  # -1: padding
    assert from_tensors(X, padded, TX, padded[:2], IDS, num_classes=3).num_classes == 3


class Items:
    """A torchvision-style dataset: item i is (x, y) from a function of i."""

    def __init__(self, size: int, item: Callable[[int], tuple[Any, Any]]) -> None:
        self.size, self.item = size, item

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return self.item(index)


def test_datasets_stack_into_what_from_tensors_gives() -> None:
    arrays = Items(6, lambda i: (X[i].numpy(), int(Y[i])))  # numpy x, int y
    tensors = Items(2, lambda i: (TX[i], TY[i]))  # tensor x, 0-d tensor y
    got = from_datasets(arrays, tensors, IDS, num_classes=3)
    want = from_tensors(X, Y, TX, TY, IDS, num_classes=3)
    for name in ("train_x", "train_y", "test_x", "test_y"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert _indices(got.partition) == CLIENTS and got.num_classes == 3
    wide = from_datasets(arrays, tensors, IDS, dtype=torch.float64)
    assert torch.equal(wide.train_x, X)  # float64 items never pass through float32
    tokens = Items(6, lambda i: (torch.arange(i, i + 5), float(i) / 4))  # ids and targets
    seq = from_datasets(tokens, Items(2, tokens.item), CLIENTS)
    assert seq.train_x.dtype == torch.int64 and seq.train_x[3].tolist() == [3, 4, 5, 6, 7]
    assert seq.train_y.dtype == torch.float32 and seq.train_y[2].item() == 0.5


def _dataset_with(item: Callable[[int], tuple[Any, Any]]) -> Callable[[], FederatedData]:
    return lambda: from_datasets(Items(6, item), Items(2, lambda i: (TX[i], TY[i])), IDS)


def _y(**at: int) -> torch.Tensor:
    """Y with row int(k[1:]) set to the value of key k (r3=5: row 3 holds 5)."""
    y = Y.clone()
    for key, value in at.items():
        y[int(key[1:])] = value
    return y


REFUSED: dict[str, tuple[Callable[[], object], str]] = {
    "float labels with classes": (
        lambda: from_tensors(X, Y.float(), TX, TY, IDS, num_classes=3),
        "train_y is torch.float32 but num_classes = 3 is given",
    ),
    "bool labels": (lambda: from_tensors(X, Y > 0, TX, TY, IDS), "train_y is torch.bool"),
    "complex labels": (
        lambda: from_tensors(X, Y, TX, TY.to(torch.complex64), IDS),
        "test_y is torch.complex64",
    ),
    "float test labels, integer train": (
        lambda: from_tensors(X, Y, TX, TY.float(), IDS),
        "test_y is torch.float32 but train_y holds integer class ids",
    ),
    "class above the range": (
        lambda: from_tensors(X, _y(r3=5), TX, TY, IDS, num_classes=3),
        r"train_y\[3\] holds class 5; num_classes = 3 allows 0..2",
    ),
    "negative class": (
        lambda: from_tensors(X, Y, TX, torch.tensor([0, -1]), IDS),
        r"test_y\[1\] holds class -1; class ids are 0 or more",
    ),
    "sequence class beyond padding": (
        lambda: from_tensors(X, torch.full((6, 3), -2), TX, TY, IDS),
        r"train_y\[0\] holds class -2; class ids are 0 or more \(and -1, padding\)",
    ),
    "num_classes zero": (
        lambda: from_tensors(X, Y, TX, TY, IDS, num_classes=0),
        "num_classes = 0 is invalid",
    ),
    "integer dtype": (
        lambda: from_tensors(X, Y, TX, TY, IDS, dtype=torch.int64),
        "dtype = torch.int64 is not a floating torch dtype",
    ),
    "x and y lengths": (
        lambda: from_tensors(X, Y[:5], TX, TY, IDS),
        "train_x has 6 rows but train_y has 5 rows",
    ),
    "train and test shapes": (
        lambda: from_tensors(X, Y, TX[:, :3], TY, IDS),
        r"test_x rows have shape \(3,\); train_x rows have \(4,\)",
    ),
    "complex features": (
        lambda: from_tensors(X.to(torch.complex64), Y, TX, TY, IDS),
        "train_x is torch.complex64; features must be real",
    ),
    "a list for features": (
        lambda: from_tensors(X.tolist(), Y, TX, TY, IDS),  # type: ignore[arg-type]
        "train_x is list; pass a torch.Tensor or numpy array",
    ),
    "a client id unused": (
        lambda: from_tensors(X, Y, TX, TY, [0, 0, 2, 2, 0, 2]),
        "partition: client 1 has no rows",
    ),
    "an empty index list": (
        lambda: from_tensors(X, Y, TX, TY, [[0, 1], [], [2]]),
        "partition: client 1 has no rows",
    ),
    "id column too short": (
        lambda: from_tensors(X, Y, TX, TY, IDS[:5]),
        "partition: the client-id column has 5 entries; train_x has 6 rows",
    ),
    "negative client id": (
        lambda: from_tensors(X, Y, TX, TY, [0, 1, -1, 1, 0, 1]),
        "partition, row 2: client id -1 is negative",
    ),
    "fractional client ids": (
        lambda: from_tensors(X, Y, TX, TY, np.array([0, 1, 0, 1.5, 0, 1])),
        r"partition: client ids are float64 \(row 3: 1.5\); they must be integers",
    ),
    "index out of range": (
        lambda: from_tensors(X, Y, TX, TY, [[0, 1], [2, 6]]),
        r"partition\[1\]: client 1's index 6 is outside train_x's rows 0..5",
    ),
    "negative index": (
        lambda: from_tensors(X, Y, TX, TY, [[0, -1], [2]]),
        r"partition\[0\]: client 0's index -1 is outside",
    ),
    "a boolean mask": (
        lambda: from_tensors(X, Y, TX, TY, [Y == 0, Y > 0]),
        "partition\\[0\\]: client 0's indices are bool",
    ),
    "row in two clients": (
        lambda: from_tensors(X, Y, TX, TY, [[0, 2], [1], [3, 2]]),
        "partition: row 2 is given to clients 0 and 2",
    ),
    "row twice in a client": (
        lambda: from_tensors(X, Y, TX, TY, [[0], [4, 1, 4]]),
        "partition: row 4 is given to client 1 twice",
    ),
    "mixed forms": (
        lambda: from_tensors(X, Y, TX, TY, [0, [1, 2]]),
        "partition mixes client ids and index lists",
    ),
    "item shape": (
        _dataset_with(lambda i: (torch.zeros(5 if i == 4 else 4), 0)),
        r"train_dataset\[4\]'s x has shape \(5,\); item 0's x has \(4,\)",
    ),
    "item not a pair": (_dataset_with(lambda i: 5), r"train_dataset\[0\] is 5; each item"),  # type: ignore[arg-type,return-value]
    "label not a number": (
        _dataset_with(lambda i: (X[i], "cat")),
        r"train_dataset\[0\]'s y = 'cat' is not a number",
    ),
    "bool item labels": (_dataset_with(lambda i: (X[i], True)), "train_y is torch.bool"),
    "float item labels with classes": (
        lambda: from_datasets(
            Items(6, lambda i: (X[i], 1.0)), Items(1, lambda i: (X[i], 0)), IDS, num_classes=2
        ),  # fmt: skip
        "train_y is torch.float32 but num_classes = 2 is given",
    ),
    "empty test set": (
        lambda: from_datasets(Items(6, lambda i: (X[i], 0)), Items(0, lambda i: (X[i], 0)), IDS),
        "test_dataset is empty",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_data_is_refused_in_one_line_naming_it(case: str) -> None:
    make, message = REFUSED[case]
    with pytest.raises(DataError, match=message) as info:
        make()
    assert "\n" not in str(info.value)


TABLES: dict[str, tuple[str, int | None, str]] = {  # text, num_rows, message after the file
    "fractional row": (
        "row,client_id\n0,0\n1.5,1\n", None, ", line 3: row = '1.5' is not an integer"
    ),
    "word client id": ("row,client_id\n0,a\n", None, ", line 2: client_id = 'a' is not an integer"),
    "row twice": (
        "row,client_id\n0,0\n1,1\n0,1\n", None,
        r", line 4: row 0 is listed twice \(also on line 2, client 0\)",
    ),
    "row past num_rows": (
        "row,client_id\n0,0\n3,1\n", 3, r", line 3: row 3 is outside 0..2 \(num_rows = 3\)"
    ),
    "rows missing": (
        "row,client_id\n0,0\n1,1\n3,0\n", 10,
        r": 7 of the 10 rows have no client \(first: 2, 4, 5, 6, 7, \.\.\.\)",
    ),
    "a client without rows": (
        "row,client_id\n0,0\n1,2\n", None, r": client 1 has no rows; client ids must run 0..2"
    ),
    "a huge client id": (
        "row,client_id\n0,0\n1,1000000000000\n", None,
        r": client 1 has no rows \(clients without rows: 999999999999\)",
    ),
    "negative client id": (
        "row,client_id\n0,0\n1,-1\n", None, ", line 3: client id -1 is negative"
    ),
    "negative row": ("row,client_id\n-2,0\n", None, ", line 2: row -2 is negative"),
    "empty file": ("", None, " is empty; expected the header row,client_id"),
    "header only": ("row,client_id\n", None, " has a header but no rows"),
    "no header": ("0,0\n1,1\n", None, ": the first line '0,0' is data, not a header"),
    "missing column": ("row\n0\n", None, ": no 'client_id' column"),
    "extra column": (
        "row,client_id,weight\n0,0,1\n", None,
        r": column\(s\) 'weight' not allowed; allowed columns: row, client_id",
    ),
    "semicolons": ("row;client_id\n0;0\n", None, ": column.* fields are separated by commas"),
    "column twice": ("row,row\n0,0\n", None, ": column 'row' appears twice"),
    "fields": ("row,client_id\n0,0,5\n", None, ", line 2: 3 field\\(s\\); the header has 2"),
    "huge value": ("row,client_id\n0,99999999999999999999\n", None, ", line 2: client_id = '9"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TABLES))
def test_bad_tables_are_refused_naming_file_line_and_value(tmp_path: Path, case: str) -> None:
    text, num_rows, message = TABLES[case]
    path = _write(tmp_path, text)
    with pytest.raises(DataError, match=re.escape(str(path)) + message):
        load_partition_table(path, num_rows)


def test_table_paths_and_arguments_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="partition table .*nope.csv: no such file"):
        load_partition_table(tmp_path / "nope.csv")
    with pytest.raises(DataError, match="unknown format '.txt'; allowed: .csv, .parquet"):
        load_partition_table(_write(tmp_path, TABLE, "t.txt"))
    with pytest.raises(DataError, match="num_rows = 0 is invalid"):
        load_partition_table(_write(tmp_path, TABLE), num_rows=0)


def _parquet(tmp_path: Path, columns: dict[str, Any], name: str = "t.parquet") -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / name
    pq.write_table(pa.table(columns), path)
    return path


def test_parquet_gives_what_the_csv_gives(tmp_path: Path) -> None:
    lines = [line.split(",") for line in TABLE.splitlines()[1:] if line]
    columns = {"client_id": [int(c) for c, _ in lines], "row": [int(r) for _, r in lines]}
    csv_part = load_partition_table(_write(tmp_path, TABLE), num_rows=6)
    for name, cast in (("a.parquet", np.int64), ("b.pq", np.uint16)):
        typed = {k: np.array(v, dtype=cast) for k, v in columns.items()}
        part = load_partition_table(_parquet(tmp_path, typed, name), num_rows=6)
        assert _indices(part) == _indices(csv_part) == CLIENTS


def test_bad_parquet_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    floats = _parquet(tmp_path, {"row": [0.0, 1.0], "client_id": [0, 0]})
    with pytest.raises(DataError, match="t.parquet: column 'row' is double; it must hold integers"):
        load_partition_table(floats)
    nulls = _parquet(tmp_path, {"row": [0, 1], "client_id": [0, None]}, "n.parquet")
    with pytest.raises(DataError, match=r"n.parquet, record 1 \(0-based\): client_id is null"):
        load_partition_table(nulls)
    extra = _parquet(tmp_path, {"row": [0], "client_id": [0], "w": [1]}, "e.parquet")
    with pytest.raises(DataError, match="column\\(s\\) 'w' not allowed; allowed columns"):
        load_partition_table(extra)
    twice = _parquet(tmp_path, {"row": [1, 0, 1], "client_id": [0, 0, 0]}, "d.parquet")
    with pytest.raises(DataError, match=r"record 2 \(0-based\): row 1 is listed twice"):
        load_partition_table(twice)
    broken = _write(tmp_path, "not parquet", "b.parquet")
    with pytest.raises(DataError, match="b.parquet is not a readable Parquet file"):
        load_partition_table(broken)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match="reading Parquet needs pyarrow: pip install pyarrow"):
        load_partition_table(floats)


def test_own_blobs_train_to_high_accuracy_through_run(one_thread: None) -> None:
    """Three Gaussian blobs (unit variance, centres 5 e_c in 4-D) over 4 clients by
    a client-id column, a linear model of 3 outputs: the classes come from the
    data. Centres are 5 sqrt(2) = 7.1 apart, so the Bayes classifier (linear here:
    equal spherical covariances) confuses two classes with probability
    Phi(-3.5) = 2e-4: it is right on 99.95% of the test points; 0.9 leaves room for
    three short rounds of SGD."""
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (600,), generator=gen)
    x = 5 * torch.eye(4)[y] + torch.randn(600, 4, generator=gen)
    clients = torch.randint(0, 4, (400,), generator=gen)  # row r of the train set: a client
    data = from_tensors(x[:400], y[:400], x[400:], y[400:], clients, num_classes=3)
    assert [len(i) for i in data.partition.client_indices] == torch.bincount(clients).tolist()
    ff.register_model("blobs_linear", lambda: nn.Linear(4, 3))
    try:
        cfg = ff.config.from_dict({
            "model": "blobs_linear", "num_clients": 4, "client_fraction": 1.0,
            "rounds": 3, "batch_size": 10, "lr": 0.1, "target_accuracy": None,
            "engine": "serial", "checkpoint_every": 0,
        })  # fmt: skip
        result = ff.run(cfg, data=data, store=False)
    finally:
        MODELS.pop("blobs_linear", None)
    assert result.summary["final_accuracy"] > 0.9

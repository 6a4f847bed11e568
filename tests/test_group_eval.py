"""Per-group evaluation: client tags from a CSV, the data (feature-shift domains,
label noise) or a data source, and each group's accuracy recorded every
evaluation round, against hand-worked figures and the final model re-evaluated
on each group's pooled held-out examples."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData

from fedforge.config import from_dict
from fedforge.core.errors import ConfigError, DataError
from fedforge.core.params import ParamSpec
from fedforge.data.federated import FederatedData
from fedforge.data.tags import UNTAGGED, data_tags, load_client_tags
from fedforge.evaluation.clients import split_holdout
from fedforge.evaluation.evaluate import evaluate
from fedforge.evaluation.groups import group_accuracies
from fedforge.report.runs import format_run_summary
from fedforge.server.experiment import build
from fedforge.server.loop import run
from fedforge.store import RunStore

F64 = torch.float64
BASE: dict[str, Any] = {
    "model": "2nn",
    "num_clients": 6,
    "client_fraction": 0.5,
    "local_epochs": 1,
    "batch_size": 8,
    "lr": 0.05,
    "rounds": 2,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
    "evaluation": {"clients": True, "holdout": 0.25},
}


def _csv(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_group_accuracy_by_hand() -> None:
    tags = {"region": ("eu", "us", "eu", "us"), "device": ("phone",) * 4}
    # (client, accuracy, loss, examples): eu = clients 0, 2; us = 1, 3 (3 undefined)
    rows = [(0, 0.5, 1.0, 4), (1, 0.25, 2.0, 8), (2, 1.0, 0.5, 12), (3, math.nan, math.nan, 2)]
    got = group_accuracies(tags, rows)
    assert got == [
        ("device", "phone", pytest.approx((2 + 2 + 12) / 24), pytest.approx(26 / 24), 26, 4),
        ("region", "eu", pytest.approx(14 / 16), pytest.approx(10 / 16), 16, 2),
        ("region", "us", 0.25, 2.0, 10, 2),
    ]
    assert group_accuracies(tags, []) == []


def test_csv_tags_and_untagged_clients(tmp_path: Path) -> None:
    # saved by a spreadsheet: a byte-order mark first
    path = _csv(tmp_path / "t.csv", "\ufeffclient_id,region,tier\n2,eu,gold\n0, us ,\n")
    tags = load_client_tags(path, 4)
    assert tags == {
        "region": ("us", UNTAGGED, "eu", UNTAGGED),
        "tier": (UNTAGGED, UNTAGGED, "gold", UNTAGGED),
    }


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "must start with a header"),
        ("id,region\n0,eu\n", "must start with a header"),
        ("client_id\n0\n", "must start with a header"),
        ("client_id,a,a\n0,x,y\n", "empty or repeated"),
        ("client_id,region\n7,eu\n", "client_id '7' must be an integer in [0, 3]"),
        ("client_id,region\nzero,eu\n", "client_id 'zero'"),
        ("client_id,region\n1,eu\n1,us\n", "line 3: client 1 listed twice"),
        ("client_id,region\n1,eu,extra\n", "line 2 has 3 fields; the header has 2"),
    ],
)
def test_bad_tag_files_are_named(tmp_path: Path, text: str, needle: str) -> None:
    path = _csv(tmp_path / "t.csv", text)
    with pytest.raises(DataError, match="evaluation.client_tags: ") as err:
        load_client_tags(path, 4)
    assert needle in str(err.value)
    with pytest.raises(DataError, match="cannot read"):
        load_client_tags(tmp_path / "absent.csv", 4)


def test_data_tags_from_shift_noise_and_source() -> None:
    tags = data_tags(3, ("rotate", "none", "rotate"), (1,), {"site": ("a", "b", "b")})
    assert tags == {
        "domain": ("rotate", "none", "rotate"),
        "label_noise": ("clean", "noisy", "clean"),
        "site": ("a", "b", "b"),
    }
    with pytest.raises(DataError, match="tags 'site' name 2 groups; need one per client"):
        data_tags(3, None, None, {"site": ("a", "b")})


def test_client_tags_need_client_eval(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="client_tags.*needs evaluation.clients: true"):
        from_dict({**BASE, "evaluation": {"clients": False, "client_tags": "x.csv"}})


def test_run_records_each_groups_accuracy(
    make_data: MakeData, one_thread: None, tmp_path: Path
) -> None:
    data = make_data([30, 12, 41, 25, 7, 33], num_test=40, dtype=F64)
    # the data source tags one attribute, the CSV another (client 5 untagged)
    data = dataclasses.replace(data, tags={"site": ("a", "a", "b", "b", "b", "a")})
    path = _csv(tmp_path / "tags.csv", "client_id,region\n0,eu\n1,us\n2,eu\n3,us\n4,eu\n")
    cfg = from_dict(
        {
            **BASE,
            "runs_dir": str(tmp_path),
            "evaluation": {**BASE["evaluation"], "client_tags": path},
        }
    )
    result = run(cfg, data=data)
    _, held = split_holdout(data.partition, 0.25, cfg.seed)
    model = build(cfg, data).model
    spec = ParamSpec.of(model, include_buffers=True)
    groups = {
        ("region", "eu"): [0, 2, 4],
        ("region", "us"): [1, 3],
        ("region", UNTAGGED): [5],
        ("site", "a"): [0, 1, 5],
        ("site", "b"): [2, 3, 4],
    }
    with RunStore.open(result.run_dir) as store:  # type: ignore[arg-type]
        rows = store.read_rows("group_eval")
        assert sorted({r[0] for r in rows}) == [0, 1]
        last = {(r[1], r[2]): r[3:] for r in rows if r[0] == 1}
        assert set(last) == set(groups)
        for key, clients in groups.items():  # the final model on the group's pooled slices
            idx = torch.tensor([i for c in clients for i in held.client_indices[c]])
            ev = evaluate(model, spec, result.params, data.train_x[idx], data.train_y[idx])
            acc, loss, n, k = last[key]
            assert acc == pytest.approx(ev.accuracy, abs=1e-12)
            assert (n, k) == (len(idx), len(clients))
            assert loss == pytest.approx(ev.loss, rel=1e-9)
        text = format_run_summary(store)
    assert "groups    round 2: region: eu " in text and "(1 client)" in text


def test_a_missing_tag_file_fails_before_the_first_round(
    make_data: MakeData, tmp_path: Path
) -> None:
    data: FederatedData = make_data([10, 10, 10, 10, 10, 10], num_test=10, dtype=F64)
    cfg = from_dict(
        {
            **BASE,
            "runs_dir": str(tmp_path),
            "evaluation": {**BASE["evaluation"], "client_tags": str(tmp_path / "no.csv")},
        }
    )
    with pytest.raises(DataError, match="client_tags: cannot read"):
        build(cfg, data)

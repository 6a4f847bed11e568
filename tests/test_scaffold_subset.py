"""SCAFFOLD's control variates on a subset of the model (scaffold.controls)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import MakeData

from fedforge.client.runtime import ClientTask, encode_payload
from fedforge.config import from_dict
from fedforge.core import wire
from fedforge.core.errors import ConfigError
from fedforge.data.federated import FederatedData
from fedforge.server.experiment import build
from fedforge.server.loop import run

F64 = torch.float64
BASE: dict[str, Any] = {
    "model": "2nn",
    "algorithm": "scaffold",
    "num_clients": 5,
    "client_fraction": 0.6,
    "local_epochs": 1,
    "batch_size": 8,
    "lr": 0.05,
    "rounds": 3,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
    "engine": "serial",
}
LAST = r"^fc3\."  # the 2NN's last layer: 200 x 10 + 10 entries
LAST_SIZE = 200 * 10 + 10


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data([20, 12, 17, 9, 14], dtype=F64)


def _upload(exp: Any) -> bytes:
    c = exp.algorithm.server.initial_state(exp.spec.size, F64)
    payload = encode_payload(exp.initial_params, 0, extras=c)
    return exp.engine.runtime.run(ClientTask(2, 0, exp.algorithm.plan(0), 0), payload)


def test_controls_on_a_subset_shrink_the_upload_by_the_uncontrolled_entries(
    data: FederatedData,
) -> None:
    full = build(from_dict(BASE), data)
    part = build(from_dict({**BASE, "scaffold": {"controls": LAST}}), data)
    p = full.spec.size
    assert p == 784 * 200 + 200 + 200 * 200 + 200 + LAST_SIZE
    # the server's control and each client's row hold only the controlled entries
    assert tuple(part.algorithm.server.initial_state(p, F64)["control"].shape) == (LAST_SIZE,)
    assert part.algorithm.client.store.size == LAST_SIZE  # type: ignore[union-attr]
    big, small = _upload(full), _upload(part)
    got = wire.decode(small).tensors
    deltas = [v for k, v in got.items() if k.endswith("control_delta")]
    assert [tuple(d.shape) for d in deltas] == [(LAST_SIZE,)]
    saved = (p - LAST_SIZE) * 8  # float64 entries of delta c_k not sent
    assert saved <= len(big) - len(small) <= saved + 16  # a shape header's digits at most


def test_controls_on_every_entry_are_full_scaffold(data: FederatedData) -> None:
    """A pattern matching every tensor takes the masked path and must give plain
    SCAFFOLD's model to the bit; one layer's controls give another model."""
    plain = run(from_dict(BASE), data, store=False).params
    every = run(from_dict({**BASE, "scaffold": {"controls": "."}}), data, store=False).params
    assert torch.equal(every, plain)
    last = run(from_dict({**BASE, "scaffold": {"controls": LAST}}), data, store=False).params
    assert not torch.equal(last, plain)
    assert torch.isfinite(last).all()


def test_uncontrolled_entries_train_as_fedavg_in_the_first_round(data: FederatedData) -> None:
    """Round 0: c = c_k = 0, so SCAFFOLD is FedAvg; with controls on fc3 only the
    correction is zero everywhere and both runs agree to the bit."""
    one = {**BASE, "rounds": 1}
    fedavg = run(from_dict({**one, "algorithm": "fedavg"}), data, store=False).params
    part = run(from_dict({**one, "scaffold": {"controls": LAST}}), data, store=False).params
    assert torch.equal(part, fedavg)


@pytest.mark.parametrize(
    ("controls", "words"), [("fc3.(", "scaffold.controls"), ("^conv", "matches no tensor")]
)
def test_bad_controls_are_one_line(data: FederatedData, controls: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        build(from_dict({**BASE, "scaffold": {"controls": controls}}), data)
    assert "\n" not in str(err.value)

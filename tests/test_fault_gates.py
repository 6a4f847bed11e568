"""Faults that come and go, under plain FedAvg: which intake gate refuses a
client's same-length uint8 upload (values 0..255 read as floats) and its
shorter uint8 bytes, in exactly the rounds its seeded schedule makes it faulty,
with the default gates and with each one off."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import TINY_LOGREG, MakeData

from fedforge.config import Config, override
from fedforge.robust.attacks import attacker_ids, faulty
from fedforge.server.loop import run

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [12, 10, 14, 9, 11, 13]
ROUNDS = 6
FAULT = {"robust.attack_fraction": 0.17, "robust.attack_probability": 0.5}
OFF = {"robust.max_update_ratio": None, "robust.max_norm_multiple": None}


def _cfg(changes: dict[str, Any]) -> Config:
    base = Config(**{**TINY_LOGREG, "num_clients": len(SIZES), "rounds": ROUNDS})
    return override(base, {"engine": "serial", **FAULT, **changes})


def _schedule() -> tuple[int, list[int]]:
    """The attacker and the rounds it is faulty in, computed from the seed."""
    (bad,) = attacker_ids(len(SIZES), 0.17, 0)
    rounds = [r for r in range(ROUNDS) if faulty(frozenset({bad}), 0.5, 0, r, bad)]
    assert 0 < len(rounds) < ROUNDS  # the fault comes and goes
    return bad, rounds


@pytest.mark.parametrize(
    ("gates", "caught_by"),
    [
        ({}, "robust.max_update_ratio"),  # the defaults: the absolute bound first
        ({"robust.max_update_ratio": None}, "robust.max_norm_multiple"),
        ({"robust.max_norm_multiple": None}, "robust.max_update_ratio"),
        ({**OFF, "robust.norm_gate": 3.5}, "norm_gate"),
    ],
)
def test_each_norm_gate_refuses_the_same_length_uint8_upload_in_its_faulty_rounds(
    make_data: MakeData, gates: dict[str, Any], caught_by: str
) -> None:
    bad, rounds = _schedule()
    res = run(_cfg({"robust.attack": "uint8_values", **gates}), make_data(SIZES))
    refused = {r: why for r, c, why in res.rejected if c == bad}
    assert all(caught_by in refused.get(r, "") for r in rounds)
    if caught_by == "norm_gate":  # a z-score over six clients also flags honest outliers
        return
    assert [(r, c) for r, c, _ in res.rejected] == [(r, bad) for r in rounds]


def test_with_the_norm_gates_off_the_same_length_upload_wrecks_the_model(
    make_data: MakeData,
) -> None:
    data = make_data(SIZES)
    off = run(_cfg({"robust.attack": "uint8_values", **OFF}), data)
    assert off.rejected == []  # well formed and finite: no form check sees it
    honest = run(_cfg({"robust.attack": "none", "robust.attack_fraction": 0.0}), data)
    # values 0..255 over P = 7,850 weights, one update in six: the model's norm
    # is in the hundreds, the honest model's about one
    assert float(off.params.norm()) > 100 * float(honest.params.norm())
    assert torch.isfinite(off.params).all()


def test_the_shorter_uint8_upload_is_refused_by_its_form_with_every_gate_off(
    make_data: MakeData,
) -> None:
    bad, rounds = _schedule()
    res = run(_cfg({"robust.attack": "uint8", **OFF}), make_data(SIZES))
    assert [(r, c) for r, c, _ in res.rejected] == [(r, bad) for r in rounds]
    assert all("'delta' has shape" in why for _, _, why in res.rejected)

"""Issue 4 part B.2-3: per-client evaluation and drift diagnostics, against
hand-worked figures and independent recomputation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.conftest import MakeData
from torch import nn

from fedforge.config import from_dict
from fedforge.core.params import ParamSpec
from fedforge.data import Partition
from fedforge.data.federated import FederatedData
from fedforge.evaluation.clients import (
    per_class_accuracy,
    split_holdout,
    summarize_accuracies,
)
from fedforge.evaluation.evaluate import evaluate
from fedforge.evaluation.participation import jain_index
from fedforge.report.progress import Progress
from fedforge.report.runs import format_run_summary
from fedforge.server.diagnostics import RoundDiagnostics, evaluation_rows, mean_pairwise_cosine
from fedforge.server.experiment import build
from fedforge.server.loop import run
from fedforge.server.round import run_round
from fedforge.server.state import LoopState
from fedforge.store import RunStore

F64 = torch.float64
BASE: dict[str, Any] = {
    "model": "2nn",
    "num_clients": 6,
    "client_fraction": 0.5,
    "local_epochs": 1,
    "batch_size": 8,
    "lr": 0.05,
    "rounds": 3,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data([30, 12, 41, 25, 7, 33], num_test=40, dtype=F64)


def _cfg(tmp_path: Path, **extra: Any) -> Any:
    return from_dict({**BASE, "runs_dir": str(tmp_path), **extra})


# ------------------------------------------------------------------ figures by hand


def test_summary_of_a_hand_worked_distribution() -> None:
    got = summarize_accuracies({0: 1.0, 1: 0.5, 2: 0.5, 3: 0.0})
    assert got.clients == 4
    assert got.mean == 0.5
    assert got.variance == pytest.approx(0.125)  # (0.25 + 0 + 0 + 0.25) / 4
    assert got.std == pytest.approx(math.sqrt(0.125))
    # sorted 0, .5, .5, 1: position 0.1 * 3 = 0.3 between 0 and .5
    assert got.p10 == pytest.approx(0.15)
    assert got.jain == pytest.approx(4.0 / (4 * 1.5))  # (sum)^2 / (n sum of squares)
    assert got.worst == ((3, 0.0), (1, 0.5), (2, 0.5), (0, 1.0))
    assert len(summarize_accuracies({c: c / 20 for c in range(20)}).worst) == 10


def test_jain_index_extremes() -> None:
    assert jain_index([0.7, 0.7, 0.7]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)  # 1/n: one has all
    assert jain_index([1.0, 3.0]) == pytest.approx(16 / (2 * 10))


def test_split_holdout_is_deterministic_disjoint_and_sized() -> None:
    part = Partition((np.arange(0, 10), np.arange(10, 11), np.arange(11, 14), np.arange(14, 54)))
    keep, held = split_holdout(part, 0.2, seed=3)
    again = split_holdout(part, 0.2, seed=3)
    assert [h.tolist() for h in held.client_indices] == [
        h.tolist() for h in again[1].client_indices
    ]
    assert [len(h) for h in held.client_indices] == [2, 0, 1, 8]  # round(0.2 n), >= 1 if n >= 2
    for k, orig in enumerate(part.client_indices):
        both = np.concatenate([keep.client_indices[k], held.client_indices[k]])
        assert sorted(both.tolist()) == orig.tolist()
    other = split_holdout(part, 0.2, seed=4)[1]
    assert [h.tolist() for h in other.client_indices] != [h.tolist() for h in held.client_indices]


def test_per_class_accuracy_by_hand() -> None:
    model = nn.Linear(2, 3, bias=False).to(F64)
    with torch.no_grad():  # logits = (x0, x1, 0.5): class 2 unless a feature beats 0.5
        model.weight.copy_(torch.tensor([[1.0, 0], [0, 1.0], [0, 0]], dtype=F64))
    spec = ParamSpec.of(model)
    params = spec.flatten(model, F64)
    params_bias = params  # no bias: class 2 is never predicted with x >= 0 below
    x = torch.tensor([[1.0, 0], [0, 1.0], [1.0, 0], [0, 1.0], [1.0, 0]], dtype=F64)
    y = torch.tensor([0, 1, 1, 1, 2])
    got = per_class_accuracy(model, spec, params_bias, x, y, num_classes=4, batch_size=2)
    assert got == [(0, 1.0, 1), (1, 2 / 3, 3), (2, 0.0, 1), (3, None, 0)]


# -------------------------------------------------------------- diagnostics by hand


def test_mean_pairwise_cosine_gram_and_streaming_agree_with_hand_value() -> None:
    d = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [0.0, 0.0]], dtype=F64)
    want = (0 + 2 / math.sqrt(2)) / 3  # pairs: (1,2) 0, (1,3) and (2,3) 1/sqrt(2); zero row out
    assert mean_pairwise_cosine(d) == pytest.approx(want)
    diag = RoundDiagnostics(2)
    for k, row in enumerate(d):
        diag.add(k, row, 0.1 * k)
    assert diag.mean_cosine == pytest.approx(want)
    rows = diag.rows(7)["diagnostics"][0]
    # norms 1, 1, 2 sqrt 2, 0: median (1 + 1) / 2, max 2 sqrt 2
    assert rows[:2] == (7, 4)
    assert rows[3] == pytest.approx(1.0) and rows[4] == pytest.approx(2 * math.sqrt(2))
    assert rows[5] == pytest.approx(2 * math.sqrt(2))
    assert mean_pairwise_cosine(d[:1]) is None
    # random updates: streaming equals the Gram product
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(9, 50, generator=gen, dtype=F64)
    diag = RoundDiagnostics(50)
    for k, row in enumerate(u):
        diag.add(k, row, 0.0)
    assert diag.mean_cosine == pytest.approx(mean_pairwise_cosine(u), abs=1e-12)


class _Bar:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, line: str) -> None:
        self.lines.append(line)


def test_low_cosine_warns_once_after_the_streak() -> None:
    state: dict[str, Any] = {}
    bar = _Bar()
    opposite = torch.tensor([[1.0, 0.0], [-1.0, 0.1]], dtype=F64)  # cosine about -1
    same = torch.tensor([[1.0, 0.0], [1.0, 0.1]], dtype=F64)
    for r, rows in enumerate([opposite, opposite, same, opposite, opposite, opposite, opposite]):
        diag = RoundDiagnostics(2)
        for k, row in enumerate(rows):
            diag.add(k, row, 0.0)
        diag.warn(state, bar, r, 0.3, 3)  # type: ignore[arg-type]
    assert len(bar.lines) == 1 and bar.lines[0].startswith("round 6: warning")  # round_idx 5


# ------------------------------------------------------------------ end to end


def test_run_records_client_eval_classes_and_diagnostics(
    data: FederatedData, tmp_path: Path
) -> None:
    cfg = _cfg(
        tmp_path, evaluation={"clients": True, "holdout": 0.25}, diagnostics={"loss_gap": True}
    )
    result = run(cfg, data=data)
    keep, held = split_holdout(data.partition, 0.25, cfg.seed)
    with RunStore.open(result.run_dir) as store:  # type: ignore[arg-type]
        evals = store.read_rows("client_eval")
        last = [r for r in evals if r[0] == 2]
        assert sorted({r[0] for r in evals}) == [0, 1, 2]
        assert [r[1] for r in last] == list(range(6))
        model = build(cfg, data).model
        spec = ParamSpec.of(model, include_buffers=True)
        for _, c, acc, loss, n in last:  # recomputed apart: the final model on the slice
            idx = torch.tensor(held.client_indices[c])
            ev = evaluate(model, spec, result.params, data.train_x[idx], data.train_y[idx])
            assert (acc, n) == (ev.accuracy, len(idx)) and loss == pytest.approx(ev.loss)
        classes = [r for r in store.read_rows("class_accuracy") if r[0] == 2]
        assert sum(r[3] for r in classes) == len(data.test_y)
        correct = sum(r[2] * r[3] for r in classes if r[2] is not None)
        assert correct / len(data.test_y) == pytest.approx(store.rounds()[-1].test_accuracy)
        diag = store.read_rows("diagnostics")
        assert [r[0] for r in diag] == [0, 1, 2] and all(r[1] == 3 for r in diag)
        for r in diag:
            norms = [c.update_norm for c in store.client_rounds(r[0])]
            assert r[4] == pytest.approx(max(norms)) and r[3] == pytest.approx(np.median(norms))
            assert -1.0 <= r[2] <= 1.0
        gaps = store.read_rows("client_gaps", round_idx=0)
        client_rows = {c.client_id: c for c in store.client_rounds(0)}
        exp = build(cfg, data)
        for _, c, local, glob, gap in gaps:  # global loss of the initial model on its data
            idx = torch.tensor(keep.client_indices[c])
            ev = evaluate(model, spec, exp.initial_params, data.train_x[idx], data.train_y[idx])
            assert glob == pytest.approx(ev.loss) and local == client_rows[c].train_loss
            assert gap == pytest.approx(glob - local)
        text = format_run_summary(store)
    assert "clients   round 3: mean" in text and "Jain" in text and "worst" in text
    assert "classes   round 3:" in text and "drift     round 3: mean cosine" in text
    assert "loss gap" in text


def test_training_excludes_the_held_out_slice(data: FederatedData) -> None:
    cfg = from_dict({**BASE, "evaluation": {"clients": True}})
    exp = build(cfg, data)
    for c in range(6):
        train = set(exp.data.partition.client_indices[c].tolist())
        held = set(exp.data.holdout.client_indices[c].tolist())  # type: ignore[union-attr]
        assert held and not train & held
        assert train | held == set(data.partition.client_indices[c].tolist())


def test_fedbn_client_eval_uses_each_clients_batch_norm(make_data: MakeData) -> None:
    data = make_data([20, 12, 17, 9], num_test=20, dtype=F64)
    cfg = from_dict(
        {
            **BASE,
            "model": "cnn_bn",
            "algorithm": "fedbn",
            "num_clients": 4,
            "evaluation": {"clients": True},
        }
    )
    exp = build(cfg, data)
    state = LoopState.fresh(exp)
    bar = Progress(cfg.rounds, "t", enabled=False)
    for r in range(2):
        run_round(exp, state, r, bar)
    personal = exp.algorithm.personal
    assert personal is not None
    rows = evaluation_rows(exp, state.params, 1)["client_eval"]
    differs = False
    for _, c, acc, loss, _ in rows:
        x, y = exp.data.holdout_data(c)
        own = evaluate(exp.model, exp.spec, personal.start(c, state.params), x, y)
        glob = evaluate(exp.model, exp.spec, state.params, x, y)
        assert (acc, loss) == (own.accuracy, own.loss)
        differs |= personal.store.has(c) and own.loss != glob.loss  # type: ignore[attr-defined]
    assert differs

"""Issue 4 aggregation weights from client reports: quality (validation loss) and
class reweighting (label counts), against hand-worked numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.conftest import TINY_LOGREG, MakeData
from torch.func import functional_call

from fedforge.aggregation.mean import WeightedMean
from fedforge.aggregation.weights import class_weights, quality_factors, quality_weights
from fedforge.client.reports import ClientReport, Reporter, ReportWeights, read_report
from fedforge.client.runtime import ClientTask, encode_payload
from fedforge.config import from_dict
from fedforge.core import wire
from fedforge.core.errors import ConfigError, UploadError
from fedforge.data import Partition, load_mnist
from fedforge.data.federated import FederatedData
from fedforge.pipeline.pipeline import CohortUpdates, Pipeline, StageContext
from fedforge.robust.gates import NormGate
from fedforge.server import loop
from fedforge.server.collectors.intake import check_update
from fedforge.server.experiment import Experiment, build

F64 = torch.float64
U = torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]], dtype=F64)


def test_quality_factors_by_hand() -> None:
    # exp(-0) : exp(-ln 2) : exp(-ln 4) = 1 : 1/2 : 1/4, normalised by 7/4
    q = quality_factors([0.0, math.log(2), math.log(4)], temperature=1.0)
    assert q == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    # T = 2 halves the exponent: exp(-2 ln 2 / 2) = 1/2
    assert quality_factors([0.0, 2 * math.log(2)], 2.0) == pytest.approx([2 / 3, 1 / 3])
    # only the loss gaps matter, and huge losses do not underflow
    assert quality_factors([1000.0, 1000 + math.log(2)], 1.0) == pytest.approx([2 / 3, 1 / 3])
    # n_k q_k: sizes 10, 20, 40 exactly cancel the factors above
    w = quality_weights([10, 20, 40], [0.0, math.log(2), math.log(4)], 1.0)
    assert w == pytest.approx([40 / 7] * 3)
    with pytest.raises(ValueError, match="finite"):
        quality_factors([0.0, math.nan], 1.0)


def test_class_weights_by_hand() -> None:
    counts = [[2, 0, 1, 0], [2, 1, 0, 0], [0, 1, 0, 0]]  # class 3: nobody, dropped
    # N_c = 4, 2, 1: w = 2/4 + 1/1, 2/4 + 1/2, 1/2
    assert class_weights(counts) == pytest.approx([1.5, 1.0, 0.5])
    assert sum(class_weights(counts)) == pytest.approx(3.0)  # the classes the cohort holds
    # equal label mixes: weights proportional to size, i.e. FedAvg
    assert class_weights([[1, 1], [3, 3]]) == pytest.approx([0.5, 1.5])  # 2 : 6


def cohort(reports: list[ClientReport]) -> CohortUpdates:
    ids = [10, 11, 12]
    n = torch.tensor([float(r.num_examples) for r in reports], dtype=F64)
    return CohortUpdates(ids, U.clone(), n, dict(zip(ids, reports, strict=True)))


def test_stage_weights_give_the_hand_mean() -> None:
    ctx = StageContext(0, 0)
    quality = [ClientReport(10, val_loss=0.0), ClientReport(20, val_loss=math.log(2))]
    quality.append(ClientReport(40, val_loss=math.log(4)))
    out, refused = ReportWeights("quality").apply(cohort(quality), ctx)
    assert refused == [] and torch.allclose(
        WeightedMean().aggregate(out.updates, out.weights), U.mean(dim=0)
    )
    counts = [(2, 0, 1), (2, 1, 0), (0, 1, 0)]
    reports = [ClientReport(sum(c), label_counts=c) for c in counts]
    out, _ = ReportWeights("class").apply(cohort(reports), ctx)
    want = (1.5 * U[0] + 1.0 * U[1] + 0.5 * U[2]) / 3.0
    assert torch.allclose(WeightedMean().aggregate(out.updates, out.weights), want)


def test_weight_cap_bounds_what_a_claimed_size_earns() -> None:
    """A client claiming 2^53 examples took all the weight of both rules; with
    aggregation.weight_cap = 20 it counts 20 examples (its class counts scaled alike)."""
    liar = 2**53
    quality = [ClientReport(10, val_loss=0.0), ClientReport(liar, val_loss=0.0)]
    assert ReportWeights("quality", cap=20).weights(quality) == pytest.approx([5.0, 10.0])
    assert ReportWeights("quality").weights(quality)[1] > 1e15  # uncapped
    counts = [(10, 10), (liar // 2, liar // 2)]
    reports = [ClientReport(sum(c), label_counts=c) for c in counts]
    # capped counts (10, 10) and (10, 10): N_c = 20 each, each client 10/20 + 10/20
    assert ReportWeights("class", cap=20).weights(reports) == pytest.approx([1.0, 1.0])
    uncapped = ReportWeights("class").weights(reports)
    assert uncapped[1] / uncapped[0] > 1e14


def test_weights_stage_must_come_after_the_gates() -> None:
    with pytest.raises(ConfigError, match="last cohort stage"):
        Pipeline(WeightedMean(), cohort=(ReportWeights("class"), NormGate(3.5)))
    Pipeline(WeightedMean(), cohort=(NormGate(3.5), ReportWeights("class")))


@pytest.mark.parametrize(
    ("rule", "meta", "why"),
    [
        ("quality", {}, "val_loss None"),
        ("quality", {"val_loss": -1.0}, "finite number >= 0"),
        ("quality", {"val_loss": True}, "finite number >= 0"),
        ("quality", {"val_loss": "0.3"}, "finite number >= 0"),
        ("class", {}, "label_counts None"),
        ("class", {"label_counts": [1, 2]}, "3 integers >= 0 summing to num_examples = 5"),
        ("class", {"label_counts": [1, 2, 3]}, "summing to num_examples = 5"),
        ("class", {"label_counts": [-1, 3, 3]}, "integers >= 0"),
        ("class", {"label_counts": [1.0, 2, 2]}, "integers >= 0"),
    ],
)
def test_malformed_reports_are_refused(rule: str, meta: dict[str, Any], why: str) -> None:
    with pytest.raises(UploadError, match=why):
        read_report(meta, rule, 5, 3)


def test_reports_read_back() -> None:
    assert read_report({"val_loss": 0.5}, "quality", 5, 3) == ClientReport(5, val_loss=0.5)
    got = read_report({"label_counts": [1, 0, 4]}, "class", 5, 3)
    assert got == ClientReport(5, label_counts=(1, 0, 4))
    assert read_report({}, "num_examples", 5, 3) == ClientReport(5)


BASE: dict[str, Any] = dict(TINY_LOGREG)
SIZES = [5, 9, 30, 2]


def test_validation_split(make_data: MakeData) -> None:
    data = make_data(SIZES, dtype=F64)
    rep = Reporter(data.client_data, "quality", 10, 0.1, seed=0)
    for c, n in enumerate(SIZES):
        x, y = data.client_data(c)
        tx, ty = rep.train_data(c)
        vx, vy = rep.validation(c)
        held = min(max(1, round(0.1 * n)), n - 1)  # 1, 1, 3, 1
        assert (len(vy), len(ty)) == (held, n - held)
        # disjoint, together the client's data, as (seed, "validation", client) draws
        perm = np.random.default_rng(_derive(0, "validation", c)).permutation(n)
        assert torch.equal(vy, y[np.sort(perm[:held])]) and torch.equal(vx, x[np.sort(perm[:held])])
        assert torch.equal(ty, y[np.sort(perm[held:])])
    single = Reporter(
        lambda c: (torch.zeros(1, 2), torch.zeros(1, dtype=torch.int64)), "quality", 10, 0.1, 0
    )
    assert len(single.train_data(0)[1]) == 1 and len(single.validation(0)[1]) == 1
    counting = Reporter(data.client_data, "class", 10, 0.1, 0)
    assert torch.equal(counting.train_data(2)[1], data.client_data(2)[1])  # nothing held out


def _derive(seed: int, *keys: int | str) -> int:
    from fedforge.core.rng import derive_seed

    return derive_seed(seed, *keys)


def _client_deltas(exp: Experiment) -> tuple[list[torch.Tensor], list[dict[str, Any]], list[int]]:
    runtime = exp.engine.runtime  # type: ignore[attr-defined]
    payload = encode_payload(exp.initial_params, 0)
    deltas, metas, sizes = [], [], []
    for c in range(exp.cfg.num_clients):
        msg = wire.decode(runtime.run(ClientTask(c, 0, exp.algorithm.plan(0), 0), payload))
        deltas.append(msg.tensors["delta"])
        metas.append(msg.meta)
        sizes.append(msg.meta["num_examples"])
    return deltas, metas, sizes


def test_quality_round_by_hand(make_data: MakeData, one_thread: None) -> None:
    data = make_data(SIZES, dtype=F64)
    cfg = from_dict({**BASE, "aggregation": {"weights": "quality", "quality_temperature": 0.5}})
    exp = build(cfg, data)
    assert "weights:quality" in exp.pipeline.describe() and not exp.pipeline.streams
    deltas, metas, sizes = _client_deltas(exp)
    weights = []
    for c, n in enumerate(SIZES):
        held = min(max(1, round(0.1 * n)), n - 1)
        perm = np.random.default_rng(_derive(cfg.seed, "validation", c)).permutation(n)
        x, y = data.client_data(c)
        val = torch.from_numpy(np.sort(perm[:held]))
        logits = functional_call(exp.model, exp.spec.views(exp.initial_params), (x[val],))
        loss = float(F.cross_entropy(logits, y[val]))  # the global model on the split
        assert metas[c]["val_loss"] == pytest.approx(loss, rel=1e-12)
        assert sizes[c] == n - held
        weights.append(sizes[c] * math.exp(-loss / 0.5))
    want = exp.initial_params + sum(w * d for w, d in zip(weights, deltas, strict=True)) / sum(
        weights
    )
    got = loop.run(cfg, data=data, store=False)
    assert torch.allclose(got.params, want, atol=1e-12)


def test_class_round_by_hand_and_its_bytes(make_data: MakeData, one_thread: None) -> None:
    data = make_data(SIZES, dtype=F64)
    cfg = from_dict({**BASE, "aggregation": {"weights": "class"}})
    exp = build(cfg, data)
    deltas, metas, sizes = _client_deltas(exp)
    counts = [np.bincount(data.client_data(c)[1].numpy(), minlength=10) for c in range(4)]
    assert [m["label_counts"] for m in metas] == [c.tolist() for c in counts]
    assert sizes == SIZES  # nothing is held out for class weights
    total = sum(counts)
    weights = [sum(n / t for n, t in zip(row, total, strict=True) if t > 0) for row in counts]
    want = exp.initial_params + sum(w * d for w, d in zip(weights, deltas, strict=True)) / sum(
        weights
    )
    got = loop.run(cfg, data=data, store=False)
    assert torch.allclose(got.params, want, atol=1e-12)
    # the counts are a real cost on the wire: their JSON in each update's header
    plain = loop.run(from_dict(BASE), data=data, store=False)
    extra = sum(
        len(',"label_counts":' + json.dumps(c.tolist(), separators=(",", ":"))) for c in counts
    )
    assert got.rounds[0].bytes_up - plain.rounds[0].bytes_up == extra


def test_malformed_report_is_rejected_not_fatal(make_data: MakeData) -> None:
    exp = build(
        from_dict({**BASE, "aggregation": {"weights": "quality"}}), make_data(SIZES, dtype=F64)
    )
    delta = torch.zeros(exp.spec.size, dtype=F64)
    meta = {"client_id": 1, "round_idx": 0, "num_examples": 8, "val_loss": None}
    with pytest.raises(UploadError, match="val_loss"):
        check_update(exp, 1, 0, wire.encode({"delta": delta}, meta))
    up = check_update(exp, 1, 0, wire.encode({"delta": delta}, {**meta, "val_loss": 0.25}))
    assert up.report == ClientReport(8, val_loss=0.25)


def test_config_refusals() -> None:
    with pytest.raises(ConfigError, match=r"'aggregation.quality_temperature' = 0\.0.*> 0"):
        from_dict({**BASE, "aggregation": {"quality_temperature": 0}})
    with pytest.raises(ConfigError, match=r"'aggregation.quality_holdout' = 1\.0.*\(0, 1\)"):
        from_dict({**BASE, "aggregation": {"quality_holdout": 1.0}})
    with pytest.raises(ConfigError, match="'aggregation.weights' = 'loss'.*'quality', 'class'"):
        from_dict({**BASE, "aggregation": {"weights": "loss"}})


def test_refused_beside_robust_rules_and_dp(make_data: MakeData) -> None:
    data = make_data(SIZES, dtype=F64)
    with pytest.raises(ConfigError, match="weighs updates its own way"):
        build(
            from_dict(
                {**BASE, "aggregation": {"weights": "class"}, "robust": {"aggregator": "median"}}
            ),
            data,
        )
    with pytest.raises(ConfigError, match="privacy.weights"):
        build(
            from_dict(
                {**BASE, "aggregation": {"weights": "quality"}, "privacy": {"dp": "central"}}
            ),
            data,
        )
    # local DP noises the update on the client, but a report would travel exact:
    # the server read a client's true label histogram at a reported epsilon of 0.2
    local = {"dp": "local", "clip_norm": 1.0, "noise_multiplier": 1.0}
    for rule, sent in (("quality", "validation loss"), ("class", "label counts")):
        with pytest.raises(ConfigError, match=f"exact {sent}.*local DP"):
            build(from_dict({**BASE, "aggregation": {"weights": rule}, "privacy": local}), data)
    build(from_dict({**BASE, "aggregation": {"weights": "sqrt"}, "privacy": local}), data)


def test_vectorized_engine_equals_serial(make_data: MakeData, one_thread: None) -> None:
    data = make_data([12, 7, 20, 9], dtype=F64)
    cfg = {**BASE, "rounds": 2, "aggregation": {"weights": "quality"}}
    serial = loop.run(from_dict({**cfg, "engine": "serial"}), data=data, store=False)
    vector = loop.run(from_dict({**cfg, "engine": "vectorized"}), data=data, store=False)
    assert serial.summary["engine"] == "serial" and vector.summary["engine"] == "vectorized"
    assert torch.allclose(serial.params, vector.params, atol=1e-9, rtol=0)


def test_noisy_clients_get_lower_quality_weight(
    mnist_dir: Path, one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end on real MNIST: 10 clients of 300 examples, 3 with symmetric label
    noise; after the first round the global model fits the noisy clients' validation
    splits worse, and their quality factors fall below every clean client's."""
    mnist = load_mnist(mnist_dir)
    parts = tuple(np.arange(300 * k, 300 * (k + 1)) for k in range(10))
    data = FederatedData(
        mnist.train_x[:3000],
        mnist.train_y[:3000],
        mnist.test_x[:1000],
        mnist.test_y[:1000],
        Partition(parts),
    )
    cfg = from_dict(
        {
            "model": "2nn",
            "num_clients": 10,
            "client_fraction": 1.0,
            "batch_size": 10,
            "lr": 0.05,
            "rounds": 4,
            "target_accuracy": None,
            "checkpoint_every": 0,
            "partition": {"label_noise": 0.3},
            "aggregation": {"weights": "quality"},
        }
    )
    factors: list[dict[int, float]] = []  # round -> client -> w_k / n_k, normalised

    def spying_build(c: Any, d: Any = None, t: Any = None) -> Experiment:
        exp = real_build(c, d, t)
        stage = exp.pipeline.cohort[-1]
        apply = stage.apply

        def spy(cohort: CohortUpdates, ctx: StageContext) -> Any:
            out, refused = apply(cohort, ctx)
            q = (out.weights / cohort.weights).tolist()
            factors.append({c: v / sum(q) for c, v in zip(out.client_ids, q, strict=True)})
            return out, refused

        stage.apply = spy  # type: ignore[method-assign]
        return exp

    real_build = loop.build
    monkeypatch.setattr(loop, "build", spying_build)
    result = loop.run(cfg, data=data, store=False)
    noisy = set(loop.build(cfg, data).data.noisy_clients or ())
    assert len(noisy) == 3 and len(factors) == 4
    for q in factors[1:]:
        clean = [v for c, v in q.items() if c not in noisy]
        bad = [v for c, v in q.items() if c in noisy]
        assert max(bad) < min(clean)
    last = factors[-1]
    clean_mean = np.mean([v for c, v in last.items() if c not in noisy])
    assert np.mean([last[c] for c in noisy]) < 0.5 * clean_mean
    assert result.rounds[-1].test_accuracy is not None

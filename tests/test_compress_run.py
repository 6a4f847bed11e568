"""Communication efficiency end to end, on tiny synthetic data: real bytes and
their ratio to float32, malformed compressed updates refused and never
aggregated, hierarchical aggregation equal to the flat mean, reduced upload
frequency, and a SIGTERM-stopped run with error-feedback residuals resumed bit
for bit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData

from conftest import RunStopped
from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config import from_dict, override
from fedforge.core import wire
from fedforge.core.errors import ConfigError
from fedforge.data.federated import FederatedData
from fedforge.engines import Engine, SimulationEngine
from fedforge.report.progress import Progress
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run
from fedforge.server.round import run_round
from fedforge.server.state import LoopState
from fedforge.store import RunStore, list_checkpoints

BASE: dict[str, Any] = {
    "model": "2nn",
    "num_clients": 6,
    "client_fraction": 0.5,
    "batch_size": 10,
    "lr": 0.05,
    "rounds": 4,
    "target_accuracy": None,
    "dtype": "float64",
}
P_2NN = 199_210


def _cfg(com: dict[str, Any], **extra: Any) -> Any:
    return from_dict({**BASE, **extra, "communication": com})


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data([30, 20, 40, 30, 25, 35], dtype=torch.float64)


def test_int8_with_error_feedback_is_about_4x_smaller(data: FederatedData) -> None:
    dense = run(_cfg({}, dtype="float32"), data=_f32(data), store=False)
    com = {"uplink": "int8", "error_feedback": True}
    int8 = run(_cfg(com, dtype="float32"), data=_f32(data), store=False)
    ratio = dense.summary["bytes_up"] / int8.summary["bytes_up"]
    assert 3.9 < ratio < 4.0  # P bytes + a float32 scale per 1024 + the header, vs 4P
    assert int8.summary["uplink_ratio"] == pytest.approx(ratio, rel=0.01)
    assert dense.summary["uplink_ratio"] == pytest.approx(1.0, rel=0.001)
    assert int8.summary["bytes_down"] == dense.summary["bytes_down"]
    assert not int8.rejected and torch.isfinite(int8.params).all()
    per_update = int8.rounds[0].bytes_up / int8.rounds[0].cohort_size
    assert P_2NN + 4 * 195 < per_update < P_2NN + 4 * 195 + 300  # + header
    assert "int8+ef" in int8.summary["pipeline"]


def _f32(data: FederatedData) -> FederatedData:
    return FederatedData(
        data.train_x.float(), data.train_y, data.test_x.float(), data.test_y, data.partition
    )


class _Corrupt(SimulationEngine):
    """Wraps an engine; rewrites (or drops) the update of one client."""

    name = "corrupt"

    def __init__(self, inner: Engine, client_id: int, fn: Any) -> None:
        self.inner, self.client_id, self.fn = inner, client_id, fn

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        for up in self.inner.run_cohort(tasks, payload):
            if up.client_id != self.client_id:
                yield up
            elif self.fn is not None:
                yield ClientUpload(up.client_id, self.fn(up.data), up.seconds)


def _one_round(cfg: Any, data: FederatedData, client: int, fn: Any) -> LoopState:
    exp = build(cfg, data)
    exp.engine = _Corrupt(exp.engine, client, fn)
    state = LoopState.fresh(exp)
    record, _ = run_round(exp, state, 0, Progress(cfg.rounds, "t", enabled=False))
    state.records.append(record)
    return state


def _far_index(data: bytes) -> bytes:
    msg = wire.decode(data)
    tensors = dict(msg.tensors)
    tensors["indices"] = tensors["indices"].clone()
    tensors["indices"][-1] = 0x7F  # the last gap jumps past the end
    return wire.encode(tensors, {**msg.meta, "index_coding": "delta"})


def _relabel(data: bytes) -> bytes:
    msg = wire.decode(data)
    return wire.encode(msg.tensors, {**msg.meta, "codec": "int4"})


@pytest.mark.parametrize(
    "uplink,fn,reason",
    [
        ("topk", _far_index, "out of range"),
        ("int8", _relabel, "wrong header"),
        ("int8", lambda d: d[:-7], "truncated"),
    ],
)
def test_malformed_compressed_update_is_refused_and_never_aggregated(
    data: FederatedData, uplink: str, fn: Any, reason: str
) -> None:
    cfg = _cfg({"uplink": uplink, "fraction": 0.001})
    from fedforge.selection.sampling import sample_cohort

    victim = sample_cohort(6, 0.5, 0, 0)[1]
    bad = _one_round(cfg, data, victim, fn)
    without = _one_round(cfg, data, victim, None)  # the same round, the update never sent
    assert [(r, c) for r, c, _ in bad.rejected] == [(0, victim)]
    assert reason in bad.rejected[0][2]
    assert torch.equal(bad.params, without.params)
    assert bad.records[0].bytes_up > without.records[0].bytes_up  # its bytes still counted


def _meta(**changes: Any) -> Any:
    def fn(data: bytes) -> bytes:
        msg = wire.decode(data)
        return wire.encode(msg.tensors, {**msg.meta, **changes})

    return fn


def _plus(name: str) -> Any:
    def fn(data: bytes) -> bytes:
        msg = wire.decode(data)
        return wire.encode({**msg.tensors, name: torch.zeros(3)}, msg.meta)

    return fn


@pytest.mark.parametrize(
    "com,robust,fn,reason",
    [
        ({}, {}, _meta(num_examples=10**400), "num_examples"),  # float() overflowed
        # a gathered round (the norm gate): float64 weights of 1e39 made the model inf
        ({}, {"norm_gate": 3.5}, _meta(num_examples=10**39), "num_examples"),
        ({}, {}, _meta(num_examples=0), "num_examples"),
        ({}, {}, _meta(train_loss=10**400), "train_loss"),
        ({}, {}, _meta(train_loss=True), "train_loss"),
        ({}, {}, _meta(train_loss="0.1"), "train_loss"),
        ({}, {}, _meta(client_id=99), "labelled client_id 99"),
        ({}, {}, _meta(codec="int8"), "wrong header"),  # dense never named itself
        ({}, {}, _plus("junk"), "unexpected tensors junk"),
        ({"uplink": "int8"}, {}, _plus("junk"), "unexpected tensors junk"),
        ({"uplink": "topk"}, {}, _plus("junk"), "unexpected tensors junk"),
        ({}, {}, _plus("alg/c"), "unexpected algorithm tensors c"),  # FedAvg sends none
    ],
)
def test_a_mislabelled_or_padded_update_is_refused(
    data: FederatedData, com: dict[str, Any], robust: dict[str, Any], fn: Any, reason: str
) -> None:
    from fedforge.selection.sampling import sample_cohort

    cfg = _cfg(com, robust=robust)
    victim = sample_cohort(6, 0.5, 0, 0)[1]
    bad = _one_round(cfg, data, victim, fn)
    without = _one_round(cfg, data, victim, None)
    assert [(r, c) for r, c, _ in bad.rejected] == [(0, victim)]
    assert reason in bad.rejected[0][2]
    assert torch.equal(bad.params, without.params)


def test_finite_updates_whose_sum_overflows_skip_the_round(data: FederatedData) -> None:
    """Each delta is finite (3e38 < float32's max), so with the norm bounds off each
    is accepted, but the weighted sum is inf: the round is skipped and the model
    kept, not made inf. (The default bounds refuse such an update on their own.)"""

    def huge(raw: bytes) -> bytes:
        msg = wire.decode(raw)
        return wire.encode({"delta": torch.full_like(msg.tensors["delta"], 3e38)}, msg.meta)

    from fedforge.selection.sampling import sample_cohort

    cfg = _cfg({}, dtype="float32", robust={"max_update_ratio": None, "max_norm_multiple": None})
    victim = sample_cohort(6, 0.5, 0, 0)[1]
    exp = build(cfg, _f32(data))
    state = _one_round(cfg, _f32(data), victim, huge)
    assert not state.rejected
    assert torch.equal(state.params, exp.initial_params)
    assert [(r, why) for r, why in state.skipped] == [
        (0, "the aggregate overflowed torch.float32 (inf or NaN)")
    ]


def test_labels_take_a_finite_loss_or_null() -> None:
    from fedforge.core.errors import UploadError
    from fedforge.server.update_header import MAX_EXAMPLES, read_update_header

    meta = {"client_id": 3, "round_idx": 7, "num_examples": MAX_EXAMPLES, "train_loss": 2}
    assert read_update_header(meta, 3, 7) == (2**53, 2.0)
    n, loss = read_update_header({**meta, "train_loss": None}, 3, 7)
    assert loss != loss  # NaN: the client's own loss was not finite
    for bad in (float("inf"), float("-inf"), float("nan")):  # JSON 1e999 parses to inf
        with pytest.raises(UploadError, match="train_loss"):
            read_update_header({**meta, "train_loss": bad}, 3, 7)
    with pytest.raises(UploadError, match=r"\[1, 2\^53\]"):
        read_update_header({**meta, "num_examples": MAX_EXAMPLES + 1}, 3, 7)


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_hierarchical_aggregation_equals_the_flat_mean(data: FederatedData, algorithm: str) -> None:
    """Edges forward their mean (and SCAFFOLD's summed delta c_k, which the server
    adds to c: it must reach the server, and its bytes count)."""
    flat = run(_cfg({}, algorithm=algorithm), data=data, store=False)
    tiered = run(_cfg({"groups": 2}, algorithm=algorithm), data=data, store=False)
    assert torch.allclose(tiered.params, flat.params, rtol=0, atol=1e-12)
    tensors = 2 if algorithm == "scaffold" else 1  # the delta, and delta c_k
    for f, t in zip(flat.rounds, tiered.rounds, strict=True):
        groups = t.bytes_down // (f.bytes_down // f.cohort_size) - f.cohort_size
        assert 1 <= groups <= 2  # server -> edge payloads on top of edge -> client
        edge_up = t.bytes_up - f.bytes_up
        assert groups * tensors * 8 * P_2NN <= edge_up < groups * (tensors * 8 * P_2NN + 400)
        assert t.paper_bytes == 2 * 4 * P_2NN * (f.cohort_size + groups)
        assert t.float32_up == 4 * P_2NN * tensors * (f.cohort_size + groups)
        assert t.float32_down == 4 * P_2NN * tensors * (f.cohort_size + groups)


@pytest.mark.parametrize(
    "extra",
    [
        {"stragglers": {"fraction": 0.5}, "local_epochs": 2},  # fedavg drops their work
        {"algorithm": "scaffold"},  # the control variates travel too, each way
    ],
    ids=["dropped-stragglers", "scaffold"],
)
def test_dense_ratios_count_the_messages_that_travelled(
    data: FederatedData, extra: dict[str, Any], tmp_path: Path
) -> None:
    """Uncompressed float32 reads about 1.0 both ways: the dense counterpart is of
    the messages sent, not the paper's 2 |w| K (which counts the dropped
    stragglers' uploads, and not SCAFFOLD's c)."""
    cfg = _cfg({}, dtype="float32", runs_dir=str(tmp_path), **extra)
    res = run(cfg, data=_f32(data))
    assert res.run_dir is not None
    with RunStore.open(res.run_dir) as store:
        used = [len(store.client_rounds(r.round_idx)) for r in res.rounds]
        stored = [(r.float32_up, r.float32_down) for r in store.rounds()]
        assert stored == [(r.float32_up, r.float32_down) for r in res.rounds]
    tensors = 2 if "algorithm" in extra else 1
    for r, n in zip(res.rounds, used, strict=True):
        assert r.float32_up == 4 * P_2NN * tensors * n  # every upload was used
        assert r.float32_down == 4 * P_2NN * tensors * r.cohort_size
    if "stragglers" in extra:  # some rounds lost uploads
        assert sum(used) < sum(r.cohort_size for r in res.rounds)
    assert 0.995 < res.summary["uplink_ratio"] < 1.0  # the wire headers
    assert 0.995 < res.summary["downlink_ratio"] < 1.0


@pytest.mark.parametrize(
    "extra",
    [
        {"aggregation": {"weights": "uniform"}},  # would weight the edges, not the clients
        {"privacy": {"dp": "central", "clip_norm": 1.0, "noise_multiplier": 0.1}},
    ],
    ids=["uniform-weights", "central-dp"],
)
def test_groups_refuse_what_the_edges_cannot_compute(
    data: FederatedData, extra: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError, match="communication.groups = 2"):
        build(_cfg({"groups": 2}, **extra), data)


def test_evaluation_rounds_follow_eval_every_across_upload_periods(data: FederatedData) -> None:
    """Periods of 3, evaluation.every 2: every period's model holds a round due for
    evaluation (2, 4, 6, 8, 10, 12 in 1-based rounds), so every period end is
    evaluated, not only those whose last round is even (the 6th and the last)."""
    res = run(_cfg({"upload_every": 3}, rounds=12, evaluation={"every": 2}), data=data, store=False)
    assert [r.round_idx for r in res.rounds if r.test_accuracy is not None] == [2, 5, 8, 11]


def test_upload_every_2_trains_locally_and_uploads_once(data: FederatedData) -> None:
    every = run(_cfg({"upload_every": 2}, rounds=5), data=data, store=False)
    each = run(_cfg({}, rounds=5), data=data, store=False)
    ups = [r.bytes_up for r in every.rounds]
    assert ups[0] == 0 and ups[2] == 0 and min(ups[1], ups[3], ups[4]) > 0
    assert [r.test_accuracy is None for r in every.rounds] == [True, False, True, False, False]
    assert every.rounds[0].cohort_size == every.rounds[1].cohort_size == 3
    assert sum(ups) < 0.61 * each.summary["bytes_up"]  # 3 uploads instead of 5
    assert not torch.equal(every.params, each.params)


def test_upload_period_schedule() -> None:
    from fedforge.selection.periods import upload_period

    assert [upload_period(r, 3, 8) for r in range(8)] == [(0, 2)] * 3 + [(3, 5)] * 3 + [(6, 7)] * 2
    assert [upload_period(r, 1, 3) for r in range(3)] == [(0, 0), (1, 1), (2, 2)]


def test_downlink_codec_and_clip_run(data: FederatedData) -> None:
    res = run(_cfg({"downlink": "int8", "clip_norm": 0.5, "uplink": "bfloat16"}), data, store=False)
    assert res.summary["downlink_ratio"] == pytest.approx(3.98, abs=0.02)
    assert res.summary["uplink_ratio"] == pytest.approx(2.0, abs=0.01)  # vs float32 (not float64)
    assert "clip" in res.summary["pipeline"] and not res.rejected


def test_vectorized_engine_matches_serial_with_error_feedback(data: FederatedData) -> None:
    com = {"uplink": "topk", "fraction": 0.01, "error_feedback": True}
    serial = run(_cfg(com, engine="serial"), data=data, store=False)  # auto: vectorised
    vec = run(_cfg(com, engine="vectorized"), data=data, store=False)
    assert serial.summary["engine"] == "serial" and vec.summary["engine"] == "vectorized"
    assert torch.allclose(vec.params, serial.params, rtol=0, atol=1e-9)


# ----------------------------------------------------------------------------- resume


def test_resume_with_error_feedback_is_bit_exact(
    data: FederatedData, tmp_path: Path, run_stopped: RunStopped
) -> None:
    com = {"uplink": "int4", "error_feedback": True}
    cfg = _cfg(com, rounds=7, checkpoint_every=2, runs_dir=str(tmp_path / "ref"))
    reference = run(cfg, data=data)
    stopped = run_stopped(override(cfg, {"runs_dir": str(tmp_path / "b")}), data, 4)
    assert stopped.stopped == "SIGTERM" and stopped.run_dir is not None
    newest = list_checkpoints(stopped.run_dir)[0]
    assert newest.name == "round-000005" and any(newest.glob("client_state.r*.bin"))
    resumed = resume(stopped.run_dir, data=data)
    assert resumed.stopped is None and len(resumed.rounds) == 7
    assert torch.equal(resumed.params, reference.params)
    with RunStore.open(stopped.run_dir) as got, RunStore.open(reference.run_dir) as want:
        assert [r.bytes_up for r in got.rounds()] == [r.bytes_up for r in want.rounds()]
        assert [r.test_loss for r in got.rounds()] == [r.test_loss for r in want.rounds()]


def test_the_summary_says_more_bytes_when_the_run_sends_more_than_float32() -> None:
    from fedforge.server.summary import format_summary

    base = {"rounds_done": 1, "bytes_up": 8, "bytes_down": 8, "paper_bytes": 8}
    base |= {"wall_seconds": 1.0, "target_accuracy": None}
    text = format_summary({**base, "uplink_ratio": 0.5, "downlink_ratio": 4.0})
    assert "compress         vs float32: 2.00x more bytes up, 4.00x fewer bytes down" in text

    even = format_summary({**base, "uplink_ratio": 0.998, "downlink_ratio": 1.001})
    assert (
        "compress         vs float32: as many bytes up, as many bytes down" in even
    )  # the headers aside


def test_a_refusal_quotes_a_hostile_shape_briefly(data: FederatedData) -> None:
    """A forged header with a 100,000-dimension shape of ones (one value, so the
    body is small) was quoted whole: a 300,000-character reason, printed and kept
    in every later checkpoint. The reason is cut; the update is still refused."""
    import json
    import struct

    from fedforge.core.errors import UploadError
    from fedforge.server.collectors.base import MAX_REASON
    from fedforge.server.collectors.intake import check_update

    exp = build(_cfg({"uplink": "int8"}), data)
    dims = [1] * 100_000
    meta = {"codec": "int8", "client_id": 0, "round_idx": 0, "num_examples": 1}
    tensors = [
        {"name": "codes", "dtype": "uint8", "shape": dims, "offset": 0, "nbytes": 1},
        {"name": "scale", "dtype": "float32", "shape": dims, "offset": 1, "nbytes": 4},
    ]
    head = json.dumps({"meta": meta, "tensors": tensors}).encode()
    msg = wire.MAGIC + struct.pack("<I", len(head)) + head + bytes(5)
    with pytest.raises(UploadError) as caught:
        check_update(exp, 0, 0, msg)
    assert len(str(caught.value)) < 400
    assert "..." in str(caught.value)
    state = LoopState.fresh(exp)
    from fedforge.server.collectors.base import RoundLog

    RoundLog(state.rejected, state.skipped, Progress(1, "t", enabled=False), 0).reject(
        0, "x" * 10_000
    )
    assert len(state.rejected[0][2]) == MAX_REASON


@pytest.mark.parametrize(
    ("algorithm", "scalars", "weights"), [("fednova", 2, "num_examples"), ("feddyn", 1, "uniform")]
)
def test_dense_uplink_counts_an_algorithms_scalars_at_their_size(
    data: FederatedData, algorithm: str, scalars: int, weights: str
) -> None:
    """FedNova's n_i a_i and n_i and FedDyn's count travel as one value each
    beside the delta: the dense counterpart of an upload is 4 (P + scalars)
    bytes, so uncompressed float32 reads about 1.0, as FedAvg does."""
    from fedforge.core.registry import load_plugin

    load_plugin(str(Path(__file__).parent.parent / "examples" / f"{algorithm}.py"))
    cfg = _cfg({}, dtype="float32", algorithm=algorithm, aggregation={"weights": weights})
    res = run(cfg, data=_f32(data), store=False)
    for r in res.rounds:  # no stragglers, no refusals: every cohort client uploaded
        assert r.float32_up == 4 * (P_2NN + scalars) * r.cohort_size
    assert 0.995 < res.summary["uplink_ratio"] < 1.0  # the wire headers

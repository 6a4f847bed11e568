"""Gates and robust runs end to end: the server refuses each bad upload kind with
its reason and the global model is bit-identical to a run without that client;
rounds with too few updates are skipped; the client gate withholds; anomalies
reach the run store; impossible combinations are refused at build time; median
and Krum hold under sign-flipping attackers."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conftest import MakeData
from fedforge import robust as agg
from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config import Config, EvaluationConfig, RobustConfig, override
from fedforge.core.errors import ConfigError
from fedforge.data import Partition
from fedforge.data.federated import FederatedData
from fedforge.engines.serial import SerialEngine
from fedforge.pipeline.pipeline import Pipeline
from fedforge.report.progress import Progress
from fedforge.robust import Median
from fedforge.robust.attacks import Collusion, attacker_ids
from fedforge.robust.gates import NormGate, robust_z
from fedforge.server.collectors.gathered import Gathering
from fedforge.server.collectors.intake import Upload
from fedforge.server.experiment import build
from fedforge.server.loop import run
from fedforge.server.optimizers import ServerSGD
from fedforge.server.round import run_round
from fedforge.server.state import LoopState
from fedforge.server.stops import stalled as _stalled
from fedforge.store import AnomalyRecord, RunStore
from fedforge.store.runstore import ClientRecord, RoundRecord


def tiny(num_clients: int, rounds: int = 2, tmp: Path | None = None, **robust: object) -> Config:
    return Config(
        model="2nn",
        engine="serial",  # the tests patch the serial engine's cohort
        num_clients=num_clients,
        client_fraction=1.0,
        local_epochs=1,
        batch_size=None,
        lr=0.1,
        rounds=rounds,
        target_accuracy=None,
        dtype="float64",
        checkpoint_every=0,
        runs_dir=str(tmp) if tmp else "runs",
        robust=RobustConfig(**robust),  # type: ignore[arg-type]
    )


def run_without(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, data: FederatedData, absent: frozenset[int]
) -> torch.Tensor:
    """The final parameters of ``cfg`` when the clients ``absent`` never answer."""
    honest = SerialEngine.run_cohort

    def cohort(
        self: SerialEngine, tasks: Sequence[ClientTask], payload: bytes
    ) -> Iterator[ClientUpload]:
        return (u for u in honest(self, tasks, payload) if u.client_id not in absent)

    with monkeypatch.context() as patch:
        patch.setattr(SerialEngine, "run_cohort", cohort)
        return run(cfg, data=data, progress=False, store=False).params


BAD_UPLOADS = {
    "nan_inf": ({}, "delta holds non-finite values"),
    "uint8": ({}, "'delta' has shape (24902,) and dtype torch.float64; expected (199210,)"),
    # the norm gate alone (the default bound relative to the others' norms off)
    "scaled": (
        {"attack_scale": 1000.0, "norm_gate": 3.5, "max_norm_multiple": None},
        "norm_gate: update norm",
    ),
    # the default bound: 10 x the median norm, of round 1's uploads, then of round 1's taken
    "scaled_default": ({"attack_scale": 1000.0}, "robust.max_norm_multiple (10) x"),
}


@pytest.mark.parametrize("attack", list(BAD_UPLOADS))
def test_bad_upload_is_refused_and_the_model_is_as_if_the_client_was_absent(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch, attack: str
) -> None:
    extra, reason = BAD_UPLOADS[attack]
    data = make_data([5, 7, 9, 6, 8, 4], seed=1)
    cfg = tiny(6, attack=attack.removesuffix("_default"), attack_fraction=1 / 6, **extra)
    (bad,) = attacker_ids(6, 1 / 6, cfg.seed)
    result = run(cfg, data=data, progress=False, store=False)
    assert [(r, c) for r, c, _ in result.rejected] == [(0, bad), (1, bad)]
    assert all(reason in why for _, _, why in result.rejected), result.rejected
    clean = tiny(6, **extra)
    assert torch.equal(result.params, run_without(monkeypatch, clean, data, frozenset({bad})))


def test_round_is_skipped_below_min_clients_and_anomalies_are_stored(
    make_data: MakeData, tmp_path: Path
) -> None:
    data = make_data([4, 6, 5])
    cfg = tiny(3, tmp=tmp_path, attack="nan_inf", attack_fraction=2 / 3, min_clients=2)
    bad = attacker_ids(3, 2 / 3, cfg.seed)
    result = run(cfg, data=data, progress=False, store=True)
    exp = build(cfg, data)
    assert torch.equal(result.params, exp.initial_params)
    assert [r for r, _ in result.skipped] == [0, 1]
    assert all("fewer than min_clients = 2" in why for _, why in result.skipped)
    assert result.run_dir is not None
    with RunStore.open(result.run_dir) as store:
        assert store.anomaly_counts() == {c: 2 for c in bad}
        rows = store.anomalies()
        assert [(a.round_idx, a.client_id) for a in rows if a.client_id is None] == [
            (0, None),
            (1, None),
        ]
        assert store.client_rounds() == []  # a skipped round aggregates no client


def test_krum_left_with_too_few_updates_skips_the_round(make_data: MakeData) -> None:
    """A statistical gate (here the norm gate; the default bound relative to the
    others' norms, which would refuse first, off) is no proof of a fault: f
    stays, and Krum left with 4 < 2f + 3 updates skips the round."""
    data = make_data([4, 6, 5, 5, 7])
    cfg = tiny(
        5, aggregator="krum", byzantine=1, attack="scaled", attack_fraction=0.2,
        attack_scale=1000.0, norm_gate=3.5, max_norm_multiple=None,
    )  # fmt: skip
    result = run(cfg, data=data, progress=False, store=False)
    assert all("norm_gate" in why for _, _, why in result.rejected) and result.rejected
    assert len(result.skipped) == 2
    assert "needs n >= 2f + 3 = 5 updates; got n = 4" in result.skipped[0][1]
    assert torch.equal(result.params, build(cfg, data).initial_params)


def test_client_gate_holds_out_data_and_withholds_worse_models(make_data: MakeData) -> None:
    data = make_data([10, 20])
    exp = build(tiny(2, client_gate=True, holdout_fraction=0.2), data)
    gate = exp.robust.gate if exp.robust else None
    assert gate is not None
    x, y = data.client_data(1)
    tx, ty = gate.train_data(1)
    hx, hy = gate.holdout(1)
    assert (len(ty), len(hy)) == (16, 4)
    together = torch.cat([tx, hx]).flatten(1)
    assert sorted(map(tuple, together.tolist())) == sorted(map(tuple, x.flatten(1).tolist()))
    start = exp.initial_params
    args = (exp.model, exp.spec, exp.algorithm.loss_fn, 1)
    assert gate.check(*args, start, start.clone()) is None
    noisy = start + 5 * torch.randn(start.shape, generator=torch.Generator().manual_seed(0))
    why = gate.check(*args, start, noisy.to(start.dtype))
    assert why is not None and "held-out loss rose from" in why


def test_withheld_updates_are_reported_with_the_clients_reason(
    make_data: MakeData, tmp_path: Path
) -> None:
    data = make_data([10, 12, 14, 9])
    result = run(
        tiny(4, tmp=tmp_path, client_gate=True, holdout_fraction=0.3, rounds=1),
        data=data,
        progress=False,
    )
    withheld = [c for _, c, why in result.rejected if why.startswith("withheld by the client")]
    assert withheld, "random labels: some local model must do worse on its held-out slice"
    assert result.run_dir is not None
    with RunStore.open(result.run_dir) as store:
        stored = {c.client_id: c.num_examples for c in store.client_rounds(0)}
        assert set(stored).isdisjoint(withheld)
        sizes = {0: 10, 1: 12, 2: 14, 3: 9}
        assert all(n == sizes[c] - int(0.3 * sizes[c]) for c, n in stored.items())
        assert {a.client_id for a in store.anomalies() if a.client_id is not None} == set(withheld)


@pytest.mark.parametrize(
    ("robust", "text"),
    [
        ({"aggregator": "krum", "byzantine": 2}, "n >= 2f + 3 = 7 updates a round"),
        ({"aggregator": "bulyan", "byzantine": 1}, "n >= 4f + 3 = 7 updates a round"),
        ({"aggregator": "multi_krum", "byzantine": 1, "multi_krum_m": 5}, "exceeds n - f = 4"),
        ({"min_clients": 6}, "min_clients = 6 can never be met"),
    ],
)
def test_impossible_combinations_are_refused_at_build(
    make_data: MakeData, robust: dict[str, object], text: str
) -> None:
    with pytest.raises(ConfigError, match=text.replace("+", r"\+")):
        build(tiny(5, **robust), make_data([3] * 5))


def test_config_refuses_an_attack_fraction_without_an_attack() -> None:
    with pytest.raises(ConfigError, match="robust.attack_fraction"):
        tiny(3, attack_fraction=0.2)


def test_colluding_attack_must_come_before_the_gate() -> None:
    with pytest.raises(ConfigError, match="must be the first cohort stage"):
        Pipeline(aggregator=Median(), cohort=(NormGate(), Collusion("alie", frozenset())))


def test_robust_z_hand_worked() -> None:
    # median 2, MAD = median(|1-2|, 0, |3-2|, |2-2|, |100-2|) = 1
    z = robust_z(torch.tensor([1.0, 2.0, 3.0, 2.0, 100.0]))
    assert torch.allclose(z, 0.6745 * torch.tensor([-1.0, 0, 1, 0, 98], dtype=torch.float64))
    # MAD 0: the mean absolute deviation stands in
    z0 = robust_z(torch.tensor([1.0, 1.0, 1.0, 5.0]))
    assert torch.allclose(z0, torch.tensor([0, 0, 0, 4 / (1.253314 * 1.0)], dtype=torch.float64))


@pytest.mark.parametrize("version", [1, 2])
def test_older_store_opens_and_gains_the_newer_tables(tmp_path: Path, version: int) -> None:
    """Version 1 lacks ``anomalies``, versions 1 and 2 the rounds' float32 columns:
    they read as NULL, and the first write adds them (version 3)."""
    store = RunStore.create(tmp_path, Config(name="old"))
    path = store.path
    store.record_round(RoundRecord(0, 2, 0.5, None, None, 10, 10, 10, 0.1, 1.0), [])
    store.close()
    conn = sqlite3.connect(path / "store.sqlite")
    drop = "DROP TABLE anomalies;" if version == 1 else ""
    conn.executescript(
        f"{drop} ALTER TABLE rounds DROP COLUMN float32_up;"
        f"ALTER TABLE rounds DROP COLUMN float32_down; PRAGMA user_version = {version};"
    )
    conn.close()
    with RunStore.open(path) as old:
        assert old.anomalies() == []
        assert [(r.paper_bytes, r.float32_up) for r in old.rounds()] == [(10, None)]
        old.record_round(
            RoundRecord(1, 2, 0.5, None, None, 10, 10, 10, 0.1, 1.0, None, 4, 6),
            [ClientRecord(1, 1, 5, 0.5, 1.0, 10, 10)],
            [AnomalyRecord(1, 3, "norm_gate: too big")],
        )
        assert old.anomaly_counts() == {3: 1}
        assert [(r.float32_up, r.float32_down) for r in old.rounds()] == [(None, None), (4, 6)]
        old.rewind(1)
        assert old.anomalies() == []
    conn = sqlite3.connect(path / "store.sqlite")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    conn.close()


def learnable_data(num_clients: int = 10, per: int = 30, num_test: int = 300) -> FederatedData:
    """Ten Gaussian blobs in 28x28 (class means of std 1, unit noise): a 2NN
    learns them in a few rounds."""
    g = torch.Generator().manual_seed(0)
    n = num_clients * per
    means = torch.randn(10, 1, 28, 28, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (n + num_test,), generator=g)
    x = means[y] + torch.randn(n + num_test, 1, 28, 28, generator=g, dtype=torch.float64)
    parts = tuple(np.arange(k * per, (k + 1) * per) for k in range(num_clients))
    return FederatedData(x[:n], y[:n], x[n:], y[n:], Partition(parts))


def test_median_and_krum_hold_under_sign_flipping_attackers(one_thread: None) -> None:
    # Measured (seed 0, one thread): final accuracy clean mean 1.0; with 40%
    # sign-flipping attackers mean 0.59, median 0.76, Krum (f = 2) 1.0.
    data = learnable_data()

    def final(aggregator: str, attack: str) -> float:
        cfg = Config(
            model="2nn",
            num_clients=10,
            client_fraction=1.0,
            batch_size=10,
            lr=0.1,
            rounds=5,
            evaluation=EvaluationConfig(every=5),
            target_accuracy=None,
            dtype="float64",
            robust=RobustConfig(
                aggregator=aggregator,  # type: ignore[arg-type]
                byzantine=2,
                attack=attack,  # type: ignore[arg-type]
                attack_fraction=0.0 if attack == "none" else 0.4,
            ),
        )
        acc = run(cfg, data=data, progress=False, store=False).rounds[-1].test_accuracy
        assert acc is not None
        return acc

    clean, attacked = final("mean", "none"), final("mean", "sign_flip")
    median, krum = final("median", "sign_flip"), final("krum", "sign_flip")
    assert clean >= 0.95 and attacked <= 0.8
    assert krum >= 0.95
    assert median >= attacked + 0.1


@pytest.mark.parametrize("aggregator", ["krum", "bulyan"])
def test_refused_faulty_uploads_count_among_f(
    aggregator: str, make_data: MakeData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Krum with f = 1 over 5 clients needs all 5 (2f + 3); when the server refuses
    the one NaN upload, the 4 left hold at most f - 1 = 0 faults, so the round runs
    with f = 0 instead of freezing the model: it equals Krum (f = 0) without that
    client. Bulyan (4f + 3 = 7 clients) likewise."""
    n = 5 if aggregator == "krum" else 7
    data = make_data([5, 7, 9, 6, 8, 4, 6][:n], seed=1)
    cfg = tiny(n, aggregator=aggregator, byzantine=1, attack="nan_inf", attack_fraction=1 / n)
    (bad,) = attacker_ids(n, 1 / n, cfg.seed)
    result = run(cfg, data=data, progress=False, store=False)
    assert result.skipped == []
    assert [(r, c) for r, c, _ in result.rejected] == [(0, bad), (1, bad)]
    clean = tiny(n, aggregator=aggregator, byzantine=0)
    assert torch.equal(result.params, run_without(monkeypatch, clean, data, frozenset({bad})))


def test_discount_faulty_lowers_f_only_for_f_rules() -> None:
    krum = agg.Krum(2)
    assert agg.discount_faulty(krum, 1).f == 1 and krum.f == 2  # a copy; the run's rule keeps f
    assert agg.discount_faulty(krum, 5).f == 0
    assert agg.discount_faulty(krum, 0) is krum
    median = agg.Median()
    assert agg.discount_faulty(median, 3) is median


def test_a_run_whose_every_round_is_skipped_stops_after_max_skipped_rounds(
    make_data: MakeData,
) -> None:
    data = make_data([4, 6, 5])
    cfg = tiny(3, rounds=12, attack="nan_inf", attack_fraction=1.0, max_skipped_rounds=3)
    result = run(cfg, data=data, progress=False, store=False)
    assert [r for r, _ in result.skipped] == [0, 1, 2]  # stopped after 3 of 12 rounds
    assert len(result.rounds) == 3
    assert "3 skipped rounds in a row" in result.summary["stall_stop"]
    assert "no valid update" in result.summary["stall_stop"]
    never = {"robust.max_skipped_rounds": 0, "robust.max_refused_fraction": None}
    endless = run(override(cfg, never), data=data, store=False)
    assert len(endless.rounds) == 12 and "stall_stop" not in endless.summary
    last = run(override(cfg, {"rounds": 3}), data=data, store=False)  # the stall ends the run
    assert "3 skipped rounds in a row" in last.summary["stall_stop"]
    rare = run(
        override(cfg, {"evaluation.every": 10}), data=data, store=False
    )  # evaluated at its end
    assert [r.test_accuracy is not None for r in rare.rounds] == [False, False, True]
    assert rare.summary["final_accuracy"] == result.rounds[2].test_accuracy is not None
    periods = override(cfg, {"communication.upload_every": 2})  # uploads at rounds 1, 3, 5
    result = run(periods, data=data, progress=False, store=False)
    assert [r for r, _ in result.skipped] == [1, 3, 5] and len(result.rounds) == 6
    assert "3 skipped rounds in a row" in result.summary["stall_stop"]


def test_multi_krum_with_fewer_updates_than_m_skips_the_round(make_data: MakeData) -> None:
    """m = 8 of a cohort of 10 with f = 2 is fine at build; when the norm gate
    refuses the two scaled attackers (the default bound relative to the others'
    norms, which would refuse them first and lower f, off), n - f = 6 < m: the
    round is skipped with the reason (it raised a ConfigError out of the run)."""
    data = make_data([4, 6, 5, 7, 4, 6, 5, 7, 4, 6])
    cfg = tiny(10, aggregator="multi_krum", byzantine=2, multi_krum_m=8, attack="scaled",
               attack_fraction=0.2, attack_scale=1000.0, norm_gate=3.5,
               max_norm_multiple=None)  # fmt: skip
    result = run(cfg, data=data, progress=False, store=False)
    assert [r for r, _ in result.skipped] == [0, 1]
    assert all("m = 8 exceeds n - f = 8 - 2 = 6" in why for _, why in result.skipped)


def test_an_attack_fraction_that_rounds_to_no_attacker_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"rounds to no attacker.*above 0\.05"):
        attacker_ids(10, 0.05, 0)  # round(0.5) = 0
    assert len(attacker_ids(10, 0.06, 0)) == 1


def _limit(limit: int, upload_every: int = 1) -> Config:
    changes = {"robust.max_skipped_rounds": limit, "communication.upload_every": upload_every}
    return override(Config(rounds=12), changes)


def test_only_consecutive_skipped_rounds_stop_a_run() -> None:
    state = LoopState(torch.zeros(2), ServerSGD(1.0))
    state.skipped = [(0, "a"), (1, "b"), (3, "c"), (4, "d")]
    state.next_round = 5  # round 2 moved the model
    assert _stalled(_limit(3), state) is None
    state.skipped.append((5, "e"))
    state.next_round = 6
    assert "since round 4" in str(_stalled(_limit(3), state))  # round_idx 3, counted from 1
    state.next_round = 7  # round 6 moved the model
    assert _stalled(_limit(3), state) is None
    assert _stalled(_limit(0), state) is None


def test_with_upload_periods_only_upload_rounds_count() -> None:
    """upload_every = 2: rounds 1, 3, 5... upload; the local rounds between are
    never skipped, and do not break a run of skipped uploads."""
    state = LoopState(torch.zeros(2), ServerSGD(1.0))
    state.skipped = [(1, "a"), (3, "b")]
    state.next_round = 4
    assert _stalled(_limit(3, 2), state) is None
    state.skipped.append((5, "c"))
    state.next_round = 6
    assert "since round 2" in str(_stalled(_limit(3, 2), state))
    state.next_round = 8  # round 7 uploaded and moved the model
    assert _stalled(_limit(3, 2), state) is None


def test_a_gathered_round_holds_each_update_once_in_arrival_order() -> None:
    """The gathered round copies each accepted delta into one [K, P] tensor and
    keeps a view of its row, not a second tensor; more uploads than tasks is a bug."""
    gathering = Gathering(capacity=3)
    deltas = [torch.tensor([1.0, 2.0]), torch.tensor([-3.0, 4.0])]
    uploads = [Upload(client_id=c, delta=d, num_examples=5, train_loss=0.0, nbytes=8)
               for c, d in zip((7, 2), deltas, strict=True)]  # fmt: skip
    for up in uploads:
        gathering.add(up)
    rows = gathering.updates()
    assert rows.tolist() == [[1.0, 2.0], [-3.0, 4.0]]
    assert [u.client_id for u in gathering.uploads] == [7, 2]
    for i, up in enumerate(uploads):
        assert up.delta.data_ptr() == rows[i].data_ptr()  # the row itself
    gathering.add(Upload(9, torch.zeros(2), 1, 0.0, 8))
    with pytest.raises(RuntimeError, match="more uploads than the 3 tasks"):
        gathering.add(Upload(4, torch.zeros(2), 1, 0.0, 8))


def _synthetic(tmp: Path, **extra: Any) -> Any:
    base = {
        "dataset": "synthetic", "model": "logreg", "num_clients": 10, "client_fraction": 1.0,
        "rounds": 1, "target_accuracy": None, "dtype": "float64", "engine": "serial",
        "runs_dir": str(tmp), "batch_size": 10, "lr": 0.01, "checkpoint_every": 0,
        "robust.norm_gate": 3.5, "robust.attack": "scaled", "robust.attack_fraction": 0.2,
        "robust.attack_scale": 50.0,
    }  # fmt: skip
    return override(Config(), {**base, **extra})


@pytest.mark.parametrize(
    ("algorithm", "table"),
    [("scaffold", "control"), ("fedavg", "residual"), ("fedbn", "batchnorm")],
)
@pytest.mark.parametrize("engine", ["serial", "vectorized"])
def test_a_withheld_update_leaves_the_clients_state_alone(
    make_data: MakeData, algorithm: str, table: str, engine: str
) -> None:
    """The gate decides before the client keeps anything: a withheld client's
    SCAFFOLD control, error-feedback residual or FedBN batch norm is unchanged
    (c stopped being the mean of the c_k when its new c_k was kept unsent)."""
    from fedforge.server.experiment import client_tables

    data = make_data([10, 12, 14, 9])
    extra: dict[str, Any] = {"algorithm": algorithm, "engine": engine}
    if algorithm == "fedavg":
        extra["communication"] = {"uplink": "topk", "fraction": 0.1, "error_feedback": True}
    if algorithm == "fedbn":
        extra["model"] = "cnn_bn"
    cfg = override(tiny(4, client_gate=True, holdout_fraction=0.3, rounds=1), extra)
    exp = build(cfg, data)
    gate = exp.robust.gate if exp.robust else None
    assert gate is not None
    gate.check = lambda model, spec, loss, c, *_: "no" if c in (1, 2) else None  # type: ignore
    state = LoopState.fresh(exp)
    run_round(exp, state, 0, Progress(1, "t", enabled=False))
    assert sorted(c for _, c, _ in state.rejected) == [1, 2]
    assert client_tables(exp)[table].written() == [0, 3]


@pytest.mark.parametrize("min_clients", [1, 10])
def test_diagnostics_are_of_the_updates_the_aggregator_took(
    tmp_path: Path, min_clients: int
) -> None:
    """Two scaled attackers refused by the norm gate are not in the round's figures
    (they made the max norm ~20 and the ratio ~60); a round skipped for too few
    clients took no update. Recomputed from the accepted clients' rows."""
    res = run(_synthetic(tmp_path, **{"robust.min_clients": min_clients}))
    assert len({c for _, c, _ in res.rejected}) == 2
    assert res.run_dir is not None
    with RunStore.open(res.run_dir) as store:
        ((_, clients, cosine, median, top, ratio),) = store.read_rows("diagnostics")
        norms = [c.update_norm for c in store.client_rounds(0)]
    if min_clients == 10:  # 8 left: skipped
        assert norms == [] and (clients, cosine, median, top) == (0, None, None, None)
        return
    assert clients == len(norms) == 8
    assert top == pytest.approx(max(norms)) and median == pytest.approx(np.median(norms))
    assert ratio == pytest.approx(max(norms) / np.median(norms)) and ratio < 5


def test_loss_gaps_are_recorded_without_the_update_figures(tmp_path: Path) -> None:
    cfg = _synthetic(tmp_path, **{"diagnostics.updates": False, "diagnostics.loss_gap": True})
    res = run(cfg)
    assert res.run_dir is not None
    with RunStore.open(res.run_dir) as store:
        assert store.read_rows("diagnostics") == []
        gaps = store.read_rows("client_gaps")
        used = {c.client_id: c.train_loss for c in store.client_rounds(0)}
    assert {c: local for _, c, local, _, _ in gaps} == used and len(used) == 8
    assert all(g == pytest.approx(glob - local) for _, _, local, glob, g in gaps)


def test_colluders_are_named_and_stored_with_the_row_the_server_took(
    make_data: MakeData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """IPM over top-k: the row the median gets for each attacker is -eps times
    the honest rows' mean cut to its k largest entries (what the channel
    carries), and the stored norm is that row's; the summary names the attackers."""
    cfg = tiny(6, tmp=tmp_path, rounds=1, attack="ipm", attack_fraction=0.34, aggregator="median")
    cfg = override(cfg, {"communication.uplink": "topk", "communication.fraction": 0.01})
    attackers = attacker_ids(6, 0.34, cfg.seed)
    assert len(attackers) == 2
    seen: list[torch.Tensor] = []
    median = agg.Median.aggregate

    def spy(self: agg.Median, updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        seen.append(updates.clone())
        return median(self, updates, weights)

    monkeypatch.setattr(agg.Median, "aggregate", spy)
    result = run(cfg, data=make_data([10, 12, 14, 9, 11, 13]), progress=False)
    assert result.summary["attackers"] == sorted(attackers)
    (rows,) = seen
    bad = torch.tensor([c in attackers for c in range(6)])
    k = int(torch.count_nonzero(rows[0 if not bad[0] else 1]))
    crafted = -0.5 * rows[~bad].mean(dim=0)
    keep = crafted.abs().argsort(descending=True)[:k]
    expected = torch.zeros_like(crafted)
    expected[keep] = crafted[keep]
    for i in bad.nonzero().flatten().tolist():
        assert torch.equal(rows[i], expected)
    assert result.run_dir is not None
    with RunStore.open(result.run_dir) as store:
        stored = {c.client_id: c.update_norm for c in store.client_rounds(0)}
    assert stored == {c: float(rows[c].norm()) for c in range(6)}


def test_uint8_attack_is_refused_under_secure_aggregation(make_data: MakeData) -> None:
    with pytest.raises(ConfigError, match="robust.attack 'uint8'.*privacy.secagg"):
        cfg = override(tiny(4, attack="uint8", attack_fraction=0.25), {"privacy.secagg": True})
        build(cfg, make_data([5] * 4))


def test_the_client_gate_does_not_hold_back_an_attacker(make_data: MakeData) -> None:
    """A Byzantine client sends whatever its held-out loss says: the gate's check
    passes for attackers and judges the others as before."""
    exp = build(
        tiny(4, client_gate=True, attack="sign_flip", attack_fraction=0.5), make_data([10] * 4)
    )
    gate = exp.robust.gate if exp.robust else None
    assert gate is not None and exp.robust is not None
    start = exp.initial_params
    noisy = start + 5 * torch.randn(start.shape, generator=torch.Generator().manual_seed(0))
    for c in range(4):
        why = gate.check(exp.model, exp.spec, exp.algorithm.loss_fn, c, start, noisy)
        assert (why is None) == (c in exp.robust.attackers), c


def test_a_client_without_a_loss_leaves_the_rounds_loss_to_the_others(
    make_data: MakeData, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Client 1 reports no loss (null: its local loss was not finite): the round's
    loss is the example-weighted mean of the others', not NaN."""
    from dataclasses import replace

    from fedforge.core import wire

    honest = SerialEngine.run_cohort

    def cohort(
        self: SerialEngine, tasks: Sequence[ClientTask], payload: bytes
    ) -> Iterator[ClientUpload]:
        for up in honest(self, tasks, payload):
            if up.client_id == 1:
                msg = wire.decode(up.data)
                up = replace(up, data=wire.encode(msg.tensors, {**msg.meta, "train_loss": None}))
            yield up

    data = make_data([10, 20, 30])
    monkeypatch.setattr(SerialEngine, "run_cohort", cohort)
    result = run(tiny(3, rounds=1), data=data, progress=False, store=False)
    monkeypatch.setattr(SerialEngine, "run_cohort", honest)
    clean = run(tiny(3, rounds=1, tmp=tmp_path), data=data, progress=False)
    assert torch.equal(result.params, clean.params)  # the update itself still counted
    with RunStore.open(clean.run_dir or "") as store:
        losses = {c.client_id: c.train_loss for c in store.client_rounds(0)}
    expected = (10 * losses[0] + 30 * losses[2]) / 40
    assert result.rounds[0].train_loss == pytest.approx(expected, rel=1e-12)


def test_the_client_gate_under_privacy(make_data: MakeData) -> None:
    """Withholding is a decision on the client's un-noised held-out loss: refused
    with DP that distrusts the server (local, distributed, tiers). Under secure
    aggregation alone a client may withhold, but its note names no loss (the
    review read 'held-out loss rose from 2.79235 to 200.861' at the server)."""
    from fedforge.client.runtime import ClientTask, LocalResult
    from fedforge.core import wire

    data = make_data([10, 12, 14, 9])
    noise = {"clip_norm": 1.0, "noise_multiplier": 1.0}
    for priv in (
        {"dp": "local", **noise},
        {"dp": "distributed", "secagg": True, **noise},
        {"secagg": True, "tiers": {"high_fraction": 0.5}, **noise},
    ):
        with pytest.raises(ConfigError, match="client_gate.*un-noised held-out loss"):
            build(override(tiny(4, client_gate=True), {"privacy": priv}), data)
    cfg = override(
        tiny(4, client_gate=True, holdout_fraction=0.3),
        {"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}},
    )
    exp = build(cfg, data)
    runtime = exp.engine.runtime  # type: ignore[attr-defined]
    assert exp.robust is not None and exp.robust.gate is not None
    exp.robust.gate.check = lambda *_: "held-out loss rose from 2.79 to 200.8"  # type: ignore
    start = exp.initial_params
    note = runtime.withheld(
        ClientTask(1, 0, exp.algorithm.plan(0), 0), start, LocalResult(start, 1.0, 1)
    )
    why = wire.decode(note).meta["withheld"]
    assert "2.79" not in why and "200.8" not in why and "gate" in why


@pytest.mark.parametrize(
    "extra",
    [
        {"robust.client_gate": True, "robust.holdout_fraction": 0.5},
        {"aggregation": {"weights": "quality", "quality_holdout": 0.5}},
    ],
    ids=["client-gate", "quality"],
)
def test_the_loss_gap_measures_the_data_clients_train_on(
    make_data: MakeData, extra: dict[str, Any]
) -> None:
    """The global loss of the loss gap is on what the client trains on: half of
    each client's data is held out here, which the gap read too (2.3004 against
    2.3235 for one client in the review)."""
    from fedforge.evaluation.evaluate import evaluate
    from fedforge.server.diagnostics import start_round

    data = make_data([20, 30, 40])
    cfg = override(tiny(3, rounds=1), {**extra, "diagnostics.loss_gap": True})
    exp = build(cfg, data)
    diag = start_round(exp, [0, 1, 2], exp.initial_params, False)
    assert diag is not None
    for c in range(3):
        x, y = exp.engine.runtime.data_fn(c)  # type: ignore[attr-defined]
        assert 0 < len(y) < len(data.client_data(c)[1])
        want = evaluate(exp.model, exp.spec, exp.initial_params, x, y).loss
        assert diag.global_loss[c] == pytest.approx(want, rel=1e-12)

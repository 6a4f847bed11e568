"""Buffered asynchronous aggregation (FedBuff) in the simulator: synchronous
FedAvg when M = K = the cohort with equal times; a hand-worked schedule on
the virtual clock (which updates each step takes, their staleness, the model
in float64 from gradients written here); the staleness bound; an exact resume
with updates in flight; the configs it refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.conftest import TINY_LOGREG, MakeData

from fedforge.aggregation.staleness import StalenessWeight
from fedforge.config.parse import from_dict
from fedforge.core.errors import ConfigError
from fedforge.data.federated import FederatedData
from fedforge.server.experiment import build
from fedforge.server.hooks import RoundHook, RoundInfo
from fedforge.server.loop import resume, run
from fedforge.store import RunStore, load_latest
from fedforge.store.final import load_final
from fedforge.systems import ClientProfile, write_profiles

LR = 0.001
SIZES = [4, 4, 4, 4]
SECONDS = [1.0, 2.0, 4.0, 5.0]  # each client's local work on the clock (4 examples)


def _cfg(**over: Any) -> Any:
    return from_dict({**TINY_LOGREG, **over})


def test_fedbuff_with_m_k_the_cohort_is_synchronous_fedavg(make_data: MakeData) -> None:
    """Equal times, M = K = the cohort: every step takes the cohort the synchronous
    round asks, all trained from the current model: the same model, to the bit."""
    data = make_data([5, 6, 7, 8, 9, 10])
    base = dict(num_clients=6, client_fraction=0.5, rounds=3, batch_size=3, local_epochs=2)
    sync = run(_cfg(**base), data=data, store=False)
    buffered = run(_cfg(**base, asynchronous={"mode": "fedbuff"}), data=data, store=False)
    assert torch.equal(sync.params, buffered.params)
    assert not torch.equal(sync.params, build(_cfg(**base), data).initial_params)
    for a, b in zip(sync.rounds, buffered.rounds, strict=True):
        assert (a.cohort_size, a.train_loss, a.bytes_up, a.bytes_down) == (
            b.cohort_size,
            b.train_loss,
            b.bytes_up,
            b.bytes_down,
        )
    assert buffered.summary["virtual_time_s"] == 3.0  # one virtual second a step


def _profiles(tmp_path: Path) -> str:
    """Compute times 1, 2, 4, 5 s for 4 examples; bandwidth so high that the bytes
    add nothing a float64 second can hold."""
    path = tmp_path / "profiles.csv"
    speeds = [n / s for n, s in zip(SIZES, SECONDS, strict=True)]
    write_profiles(path, [ClientProfile(c, v, 1e300, 1e300) for c, v in enumerate(speeds)])
    return str(path)


def _hand_cfg(tmp_path: Path, **over: Any) -> Any:
    fedbuff = {"mode": "fedbuff", "concurrency": 4, "buffer_size": 2, **over.pop("asyn", {})}
    fields: dict[str, Any] = {
        "rounds": 4,
        "batch_size": None,  # one full-batch step a client: delta = -lr grad
        "local_epochs": 1,
        "lr": LR,
        "systems": {"profiles": _profiles(tmp_path)},
        "asynchronous": fedbuff,
        "runs_dir": str(tmp_path / "runs"),
        "robust": {"max_norm_multiple": None},  # stale updates are larger: not a fault here
    }
    return _cfg(**{**fields, **over})


def _delta(data: FederatedData, w: torch.Tensor, k: int) -> torch.Tensor:
    """Client k's update from ``w``: one full-batch gradient step of multinomial
    logistic regression, written here (weights [10, 784] row-major, then the bias)."""
    start = sum(SIZES[:k])
    x = data.train_x[start : start + SIZES[k]].flatten(1)
    y = data.train_y[start : start + SIZES[k]]
    weight = w[:7840].view(10, 784).clone().requires_grad_(True)
    bias = w[7840:].clone().requires_grad_(True)
    loss = F.cross_entropy(x @ weight.T + bias, y)
    gw, gb = torch.autograd.grad(loss, (weight, bias))
    return -LR * torch.cat([gw.flatten(), gb])


def _steps(data: FederatedData, w0: torch.Tensor, refuse_stale: bool) -> torch.Tensor:
    """The schedule, worked by hand. All four start at t=0 on w0 and arrive at
    1, 2, 4, 5; a freed slot waits for the next step (its client was heard from),
    then takes the newest model. Step 1 (t=2): clients 0, 1, fresh. Step 2 (t=4):
    0, 1 again, fresh (client 1's arrival ties client 2's at 4: client id first).
    Step 3 (t=5): client 2 from w0 (staleness 2), client 0 from w2. Step 4 (t=6):
    client 3 from w0 (staleness 3) and client 0 from w3; or, with max_staleness
    2, client 3 refused and client 1 from w2 (staleness 1) in its place."""
    s = StalenessWeight("polynomial", 0.5)
    w1 = w0 + (_delta(data, w0, 0) + _delta(data, w0, 1)) / 2
    w2 = w1 + (_delta(data, w1, 0) + _delta(data, w1, 1)) / 2
    w3 = w2 + (s(2) * _delta(data, w0, 2) + _delta(data, w2, 0)) / 2
    if refuse_stale:
        return w3 + (_delta(data, w3, 0) + s(1) * _delta(data, w2, 1)) / 2
    return w3 + (s(3) * _delta(data, w0, 3) + _delta(data, w3, 0)) / 2


def _tables(run_dir: Path) -> tuple[list[list[int]], list[tuple[Any, ...]]]:
    with RunStore.open(run_dir) as store:
        used = [sorted(c.client_id for c in store.client_rounds(r)) for r in range(4)]
        return used, store.read_rows("buffered_rounds")


def test_staleness_weights_on_a_hand_schedule(make_data: MakeData, tmp_path: Path) -> None:
    data = make_data(SIZES)
    cfg = _hand_cfg(tmp_path)
    result = run(cfg, data=data)
    used, steps = _tables(result.run_dir)
    assert used == [[0, 1], [0, 1], [0, 2], [0, 3]]
    assert [(r[1], r[2], r[3], r[4]) for r in steps] == [
        (2.0, 2, 0.0, 0),
        (4.0, 2, 0.0, 0),
        (5.0, 2, 1.0, 2),
        (6.0, 2, 1.5, 3),
    ]
    want = _steps(data, build(cfg, data).initial_params, refuse_stale=False)
    torch.testing.assert_close(result.params, want, rtol=0, atol=1e-12)
    assert result.summary["virtual_time_s"] == 6.0


def test_staler_than_max_staleness_is_refused(make_data: MakeData, tmp_path: Path) -> None:
    data = make_data(SIZES)
    cfg = _hand_cfg(tmp_path, asyn={"max_staleness": 2})
    result = run(cfg, data=data)
    with RunStore.open(result.run_dir) as store:
        refused = [(a.round_idx, a.client_id, a.reason) for a in store.anomalies()]
    assert len(refused) == 1 and refused[0][:2] == (3, 3)
    assert "3 server steps stale, more than asynchronous.max_staleness = 2" in refused[0][2]
    used, steps = _tables(result.run_dir)
    assert used[3] == [0, 1] and steps[3][4] == 1
    want = _steps(data, build(cfg, data).initial_params, refuse_stale=True)
    torch.testing.assert_close(result.params, want, rtol=0, atol=1e-12)


def test_a_failing_client_frees_its_slot_and_a_short_buffer_steps(
    make_data: MakeData, tmp_path: Path
) -> None:
    """Client 1 always fails before its upload (its slot frees when it would have
    uploaded, at 2 s); no other client may be handed work before the next step,
    so each buffer closes with client 0's update alone (min_clients 1): the model
    moves by client 0's delta, round after round."""
    path = tmp_path / "failing.csv"
    write_profiles(
        path,
        [
            ClientProfile(0, 4.0, 1e300, 1e300),
            ClientProfile(1, 2.0, 1e300, 1e300, failure_prob=1.0),
        ],
    )
    cfg = _hand_cfg(
        tmp_path,
        num_clients=2,
        rounds=2,
        systems={"profiles": str(path)},
        asyn={"concurrency": 2},
        robust={"max_norm_multiple": None, "min_clients": 1},
    )
    data = make_data(SIZES[:2])
    result = run(cfg, data=data)
    with RunStore.open(result.run_dir) as store:
        used = [[c.client_id for c in store.client_rounds(r)] for r in range(2)]
        times = [(r[0], r[1], r[5], r[6]) for r in store.read_rows("client_times")]
        steps = [r[1] for r in store.read_rows("buffered_rounds")]
    assert used == [[0], [0]]
    assert times == [(0, 0, 1.0, 1), (0, 1, 2.0, 0), (1, 0, 1.0, 1), (1, 1, 2.0, 0)]
    assert steps == [2.0, 4.0]
    w0 = build(cfg, data).initial_params
    w1 = w0 + _delta(data, w0, 0)
    torch.testing.assert_close(result.params, w1 + _delta(data, w1, 0), rtol=0, atol=1e-12)


class _Crash(RoundHook):
    """Fails the run when round ``at`` starts (after the checkpoint before it)."""

    name = "crash"

    def __init__(self, at: int | None) -> None:
        self.at = at

    def round_start(self, info: RoundInfo) -> None:
        if info.round_idx == self.at:
            raise RuntimeError("crash")


def _rows(run_dir: Path) -> tuple[Any, ...]:
    with RunStore.open(run_dir) as store:
        rounds = [dataclasses.replace(r, seconds=0.0, created=None) for r in store.rounds()]
        return (
            rounds,
            store.client_rounds(),
            store.anomalies(),
            store.read_rows("buffered_rounds"),
            store.read_rows("client_times"),
        )


def test_resume_with_updates_in_flight_is_bit_identical(
    make_data: MakeData, tmp_path: Path
) -> None:
    data = make_data(SIZES)
    cfg = _hand_cfg(tmp_path, rounds=7, checkpoint_every=2, asyn={"buffer_size": 1})
    reference = run(cfg, data=data)
    with pytest.raises(RuntimeError, match="crash"):
        run(cfg, data=data, hooks=[_Crash(5)])  # rounds 1-5 recorded, checkpoint at 4
    (crashed,) = [p for p in Path(cfg.runs_dir).iterdir() if p != reference.run_dir]
    ckpt = load_latest(crashed)
    assert ckpt.next_round == 4 and len(ckpt.in_flight) == 3  # clients still at work
    resumed = resume(crashed, data=data, hooks=[_Crash(None)])
    assert torch.equal(load_final(crashed)["params"], load_final(reference.run_dir)["params"])
    assert torch.equal(resumed.params, reference.params)
    assert _rows(crashed) == _rows(reference.run_dir)
    assert resumed.summary["virtual_time_s"] == reference.summary["virtual_time_s"]


def test_staleness_weight_rules() -> None:
    poly = StalenessWeight("polynomial", 0.5)
    assert [poly(s) for s in (0, 3, 8)] == [1.0, 0.5, 1 / 3]
    hinge = StalenessWeight("hinge", slope=10.0, after=4)
    assert [hinge(s) for s in (0, 4, 5, 6)] == [1.0, 1.0, 1 / 11, 1 / 21]
    assert StalenessWeight("constant")(100) == 1.0
    assert StalenessWeight("constant", max_staleness=3).refusal(3) is None


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"buffer_size": 5, "concurrency": 3}, "asynchronous.buffer_size = 5 is larger"),
        ({"concurrency": 9}, "asynchronous.concurrency = 9 is more than the 4 clients"),
        ({"staleness": "linear"}, "asynchronous.staleness"),
        ({"max_staleness": -1}, "asynchronous.max_staleness"),
        ({"mode": "fedasync"}, "asynchronous.mode"),
    ],
)
def test_bad_asynchronous_fields_are_one_line(over: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(asynchronous={"mode": "fedbuff", **over})
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"privacy": {"dp": "central", "noise_multiplier": 1.0}}, "differential privacy"),
        ({"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}}, "privacy.secagg"),
        ({"robust": {"aggregator": "median"}}, "robust.aggregator = 'median'"),
        ({"algorithm": "scaffold"}, "algorithm 'scaffold'"),
        ({"communication": {"upload_every": 2}}, "communication.upload_every = 2"),
    ],
)
def test_what_fedbuff_does_not_compose_with_is_refused(over: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(asynchronous={"mode": "fedbuff"}, **over)
    text = str(info.value)
    assert text.startswith("asynchronous.mode = 'fedbuff' with ") and says in text
    assert "\n" not in text


def test_a_cohort_stage_is_refused_when_the_run_is_built(make_data: MakeData) -> None:
    cfg = _cfg(asynchronous={"mode": "fedbuff"}, robust={"norm_gate": 3.5})
    with pytest.raises(ConfigError, match="needs a streaming mean") as info:
        run(cfg, data=make_data(SIZES), store=False)
    assert "\n" not in str(info.value)

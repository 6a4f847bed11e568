"""Secure aggregation in real rounds: the masked run equals the plain run to the
fixed-point resolution, dropouts at each phase equal the plain run over the
survivors, too few survivors skip the round with the model untouched, the phase
messages are counted, impossible combinations are refused, resume is bit-exact."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import MakeData, SigtermAt, wrap_engine

from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config import from_dict, override
from fedforge.core import wire
from fedforge.core.errors import ConfigError
from fedforge.data.federated import FederatedData
from fedforge.engines import Engine, SimulationEngine
from fedforge.engines.serial import SerialEngine
from fedforge.privacy.secagg_masks import CIPHERTEXT_BYTES, KEY_BYTES, SHARE_BYTES
from fedforge.server import loop
from fedforge.server.collect import dropped
from fedforge.server.experiment import build
from fedforge.server.loop import resume, run
from fedforge.store import RunStore

SIZES = [30, 20, 40, 30, 25, 35]
FRAC_BITS = 30
FRAC_BITS_K = 33  # the modulus bits k of 6 clients clipped at 0.5 with 30 fraction bits
BASE: dict[str, Any] = {
    "model": "2nn",
    "num_clients": 6,
    "client_fraction": 1.0,
    "batch_size": 10,
    "lr": 0.05,
    "rounds": 2,
    "target_accuracy": None,
    "dtype": "float64",
}
DP = {"dp": "central", "noise_multiplier": 0.5, "clip_norm": 0.5}
SECAGG = {"secagg": True, "secagg_frac_bits": FRAC_BITS}


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data(SIZES)


def _run(data: FederatedData, priv: Mapping[str, Any], **more: Any) -> Any:
    return run(from_dict({**BASE, **more, "privacy": {**DP, **priv}}), data, store=False)


def _bound(rounds: int, k: int, denominator: float) -> float:
    """Each of the k inputs rounds to 2^-(f+1) per coordinate; the mean divides the
    sum by the denominator. Local SGD at this step size grows a difference in its
    start by a small factor (4 covers it) before the next round adds its own."""
    per_round = k * 2.0 ** -(FRAC_BITS + 1) / denominator
    return sum(per_round * 4**r for r in range(rounds))


@pytest.mark.parametrize("engine", ["serial", "vectorized"])
@pytest.mark.parametrize("weights", ["uniform", "capped"])
def test_secagg_run_equals_the_plain_run_to_fixed_point(
    data: FederatedData, engine: str, weights: str
) -> None:
    priv = {"weights": weights, "weight_cap": 30}
    plain = _run(data, priv, engine=engine)
    masked = _run(data, {**priv, **SECAGG}, engine=engine)
    assert "encode:secagg" in masked.summary["pipeline"]
    diff = float((plain.params - masked.params).abs().max())
    caps = [min(n / 30, 1.0) for n in SIZES] if weights == "capped" else [1.0] * 6
    assert diff <= _bound(2, 6, sum(caps))
    assert not masked.skipped and not masked.rejected


@pytest.mark.parametrize(
    "mode",
    [
        {"privacy": {"dp": "local", "noise_multiplier": 0.5, "clip_norm": 0.5}},
        {"privacy": {"dp": "none"}, "communication": {"clip_norm": 0.5}},
    ],
)
def test_secagg_without_central_dp_equals_the_plain_mean(
    make_data: MakeData, one_thread: None, mode: dict[str, Any]
) -> None:
    """Local DP (noise before masking) or clipping alone: with equal client sizes
    the plain example-weighted mean is the uniform mean secure aggregation takes."""
    data = make_data([30] * 6)
    cfg = {**BASE, **mode}
    plain = run(from_dict(cfg), data, store=False)
    masked = run(from_dict({**cfg, "privacy": {**cfg["privacy"], **SECAGG}}), data, store=False)
    assert "encode:secagg" in masked.summary["pipeline"]
    assert float((plain.params - masked.params).abs().max()) <= _bound(2, 6, 6.0)


@pytest.mark.parametrize(("frac_bits", "bits"), [(20, 23), (30, 33)])
def test_masked_words_travel_packed_at_k_bits(
    data: FederatedData, frac_bits: int, bits: int
) -> None:
    """k = floor(log2(6 (0.5 2^f + 0.5))) + 2 bits a word: 23 at f = 20, 33 at f = 30;
    a float64 delta costs 64."""
    exp = build(
        from_dict({**BASE, "privacy": {**DP, **SECAGG, "secagg_frac_bits": frac_bits}}), data
    )
    assert exp.privacy is not None and exp.privacy.secagg is not None
    assert exp.privacy.secagg.fp.bits == bits
    plain = _run(data, {}, rounds=1)
    masked = _run(data, {"secagg": True, "secagg_frac_bits": frac_bits}, rounds=1)
    per_round = 6 * 2.0 ** -(frac_bits + 1) / 6
    assert float((plain.params - masked.params).abs().max()) <= per_round
    saved = 6 * (8 * 199_210 - (199_210 * bits + 7) // 8)  # the 2NN, six clients
    phases = 6 * 4_000  # keys, shares and their headers: a few kB a client
    diff = masked.rounds[0].bytes_up - plain.rounds[0].bytes_up
    assert -saved < diff < -saved + phases


class _Filter(SimulationEngine):
    """A serial engine that trains only the clients ``keep(round, ids)`` returns:
    the plain run over a secure-aggregation run's survivors."""

    name = "filter"

    def __init__(self, inner: Engine, keep: Any) -> None:
        self.inner, self.keep = inner, keep

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        ids = sorted(t.client_id for t in tasks)
        live = self.keep(tasks[0].round_idx, ids) if tasks else set()
        yield from self.inner.run_cohort([t for t in tasks if t.client_id in live], payload)

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        return self.inner.run_phase(phase, messages)


@pytest.mark.parametrize("phase", ["advertise", "share_keys", "masked_input", "unmask"])
def test_dropouts_equal_the_plain_run_over_the_survivors(
    data: FederatedData, phase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    frac = 0.34  # 2 of 6 drop; t = ceil(0.66 * 6) = 4 survive
    masked = _run(data, {**SECAGG, f"secagg_drop_{phase}": frac})
    assert not masked.skipped

    def keep(round_idx: int, ids: list[int]) -> set[int]:
        if phase == "unmask":  # their masked inputs arrived: they are in the sum
            return set(ids)
        gone = dropped(0, round_idx, phase, frac, ids)
        assert len(gone) == 2
        return set(ids) - gone

    wrap_engine(monkeypatch, lambda engine: _Filter(engine, keep))
    plain = _run(data, {})
    assert float((plain.params - masked.params).abs().max()) <= _bound(2, 6, 6.0)


def test_too_few_survivors_skip_the_round_and_keep_the_model(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = build(from_dict({**BASE, "privacy": {**DP, **SECAGG}}), data).initial_params
    trained: list[int] = []

    def counting(round_idx: int, ids: list[int]) -> set[int]:
        trained.extend(ids)
        return set(ids)

    wrap_engine(monkeypatch, lambda engine: _Filter(engine, counting))
    result = _run(data, {**SECAGG, "secagg_drop_masked_input": 0.5})  # 3 left, t = 4
    assert torch.equal(result.params, before)
    assert [r for r, _ in result.skipped] == [0, 1]
    assert all("fewer than t = 4" in why for _, why in result.skipped)
    assert all(r.bytes_up > 0 for r in result.rounds)  # the phases before still cost bytes
    assert trained == []  # too few to sum before the model went out: nobody trained


def test_phase_messages_are_counted_per_client(data: FederatedData, tmp_path: Path) -> None:
    cfg = {**BASE, "rounds": 1, "runs_dir": str(tmp_path)}
    plain = run(from_dict({**cfg, "privacy": DP}), data)
    masked = run(from_dict({**cfg, "privacy": {**DP, **SECAGG}}), data)
    assert plain.run_dir is not None and masked.run_dir is not None
    with RunStore.open(plain.run_dir) as a, RunStore.open(masked.run_dir) as b:
        pa, pb = a.client_rounds(0), b.client_rounds(0)
        ra, rb = a.rounds()[0], b.rounds()[0]
    assert [c.client_id for c in pb] == list(range(6))
    assert sum(c.bytes_up for c in pb) == rb.bytes_up  # nobody dropped: all counted
    n = 6
    # up: two public keys, n - 1 encrypted share pairs, n unmasking shares
    # (id, kind, share); down: n key pairs, n - 1 routed ciphertexts, U2 and U3
    up = 2 * KEY_BYTES + (n - 1) * (CIPHERTEXT_BYTES + 8) + n * (8 + 1 + SHARE_BYTES)
    down = n * (8 + 2 * KEY_BYTES) + (n - 1) * (CIPHERTEXT_BYTES + 8) + 2 * n * 8
    size = 199_210  # the 2NN: a float64 delta is 8 bytes a parameter, a masked word k bits
    packed = (size * FRAC_BITS_K + 7) // 8 - 8 * size
    for a_, b_ in zip(pa, pb, strict=True):
        extra_up, extra_down = b_.bytes_up - a_.bytes_up, b_.bytes_down - a_.bytes_down
        # the rest is the phase messages' data plus their headers (< 200 bytes each)
        assert up <= extra_up - packed <= up + 4 * 200
        assert down <= extra_down <= down + 4 * 200
    assert rb.bytes_down - ra.bytes_down == sum(
        b_.bytes_down - a_.bytes_down for a_, b_ in zip(pa, pb, strict=True)
    )


@pytest.mark.parametrize(
    ("more", "match"),
    [
        ({"robust": {"aggregator": "median"}}, "needs individual updates"),
        ({"algorithm": "scaffold"}, "unmasked"),
        ({"privacy_": {"clip_norm": 1e7, "secagg_frac_bits": 40}}, "64"),
        ({"privacy_": {"dp": "none"}}, "bound"),
        ({"privacy_": {"adaptive_clip": True}}, "adaptive_clip"),
        ({"communication": {"uplink": "int8"}}, "uplink"),
    ],
)
def test_secagg_refuses_what_it_cannot_hide(
    data: FederatedData, more: dict[str, Any], match: str
) -> None:
    priv = {**SECAGG, **more.pop("privacy_", {})}
    if "robust" in more:  # median with central DP is refused by DP first
        priv["dp"] = "none"
        more["communication"] = {"clip_norm": 0.5}
    with pytest.raises(ConfigError, match=match):
        build(from_dict({**BASE, **more, "privacy": {**DP, **priv}}), data)


def test_resume_with_secagg_is_bit_exact(
    data: FederatedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Secure aggregation keeps no state across rounds (fresh keys each round; the
    unmasked sum is exact whatever the masks), so resume stays bit-exact."""
    priv = {**DP, **SECAGG, "secagg_drop_unmask": 0.2}
    cfg = from_dict(
        {
            **BASE,
            "engine": "serial",
            "rounds": 5,
            "checkpoint_every": 2,
            "runs_dir": str(tmp_path / "a"),
            "privacy": priv,
        }
    )
    reference = run(cfg, data)
    real_build = loop.build

    def stopping_build(c: Any, d: Any = None, t: Any = None) -> Any:
        exp = real_build(c, d, t)
        assert isinstance(exp.engine, SerialEngine)
        exp.engine = SigtermAt(exp.engine, at=2)
        return exp

    monkeypatch.setattr(loop, "build", stopping_build)
    stopped = run(override(cfg, {"runs_dir": str(tmp_path / "b")}), data)
    assert stopped.stopped == "SIGTERM" and stopped.run_dir is not None
    monkeypatch.setattr(loop, "build", real_build)
    resumed = resume(stopped.run_dir, data=data)
    assert torch.equal(resumed.params, reference.params)
    assert reference.run_dir is not None
    with RunStore.open(stopped.run_dir) as got, RunStore.open(reference.run_dir) as want:
        assert [r.test_loss for r in got.rounds()] == [r.test_loss for r in want.rounds()]
        assert len(got.rounds()) == 5


class _Tamper(SimulationEngine):
    """A serial engine whose client ``client`` has its ``phase`` reply rewritten
    by ``fn`` (tensors -> tensors): a malicious or broken client."""

    name = "tamper"

    def __init__(self, inner: Engine, phase: str, client: int, fn: Any) -> None:
        self.inner, self.phase, self.client, self.fn = inner, phase, client, fn

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        yield from self.inner.run_cohort(tasks, payload)

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        replies = self.inner.run_phase(phase, messages)
        if phase == self.phase and self.client in replies:
            msg = wire.decode(replies[self.client])
            replies[self.client] = wire.encode(self.fn(dict(msg.tensors)), msg.meta)
        return replies


def _tampered(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch, phase: str, client: int, fn: Any
) -> Any:
    with monkeypatch.context() as patch:
        wrap_engine(patch, lambda engine: _Tamper(engine, phase, client, fn))
        return _run(data, SECAGG)


def test_a_low_order_public_key_counts_as_a_dropout(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An all-zero X25519 key has no shared secret: taken, it would make every
    honest client fail to encrypt its shares to it. Refused at advertise, it is a
    dropout: the run equals the plain run without that client."""
    got = _tampered(
        data, monkeypatch, "advertise", 2, lambda t: {"keys": torch.zeros_like(t["keys"])}
    )
    assert [(r, c) for r, c, _ in got.rejected] == [(0, 2), (1, 2)]
    assert all("low-order" in why for _, _, why in got.rejected)
    assert not got.skipped

    wrap_engine(monkeypatch, lambda engine: _Filter(engine, lambda r, ids: set(ids) - {2}))
    plain = _run(data, {})
    assert float((plain.params - got.params).abs().max()) <= _bound(2, 5, 5.0)


def _shares(fill: Any) -> Any:
    def fn(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        t["shares"] = fill(t["shares"])
        return t

    return fn


def test_a_share_outside_the_field_counts_as_a_dropout(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0xff... is above the prime 2^521 - 1: refused, a dropout at unmask; the
    other five survivors' shares rebuild every secret (t = 4)."""
    got = _tampered(data, monkeypatch, "unmask", 0, _shares(lambda s: torch.full_like(s, 255)))
    assert [(r, c) for r, c, _ in got.rejected] == [(0, 0), (1, 0)]
    assert all("prime" in why for _, _, why in got.rejected)
    honest = _run(data, SECAGG)
    assert torch.equal(got.params, honest.params)  # client 0's input is in the sum


def test_a_garbled_share_skips_the_round_and_keeps_the_model(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A share below the prime but not the client's own rebuilds, with t - 1
    honest ones, a field element, not a 32-byte secret (but for odds of 2^-265):
    the sum cannot be unmasked, the round is skipped with the reason, the model is
    untouched. (Client 0 answers first, so its shares are among the t used.)"""
    gen = torch.Generator().manual_seed(0)

    def garble(s: torch.Tensor) -> torch.Tensor:
        out = torch.randint(0, 256, s.shape, generator=gen, dtype=torch.uint8)
        out[:, 0] = 0  # < 2^520 < the prime: a valid field element
        return out

    before = build(from_dict({**BASE, "privacy": {**DP, **SECAGG}}), data).initial_params
    got = _tampered(data, monkeypatch, "unmask", 0, _shares(garble))
    assert torch.equal(got.params, before)
    assert [r for r, _ in got.skipped] == [0, 1]
    assert all("rebuild no 32-byte secret" in why for _, why in got.skipped)


def test_shares_that_do_not_decrypt_make_clients_abort_not_the_run(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client 3 sends zeros for its encrypted shares (right shape): the server
    cannot check them and routes them. At unmask every other client fails to
    decrypt its share from 3 (AES-GCM's tag) and, as the paper's honest client,
    aborts: a dropout. Too few answer, so each round is skipped and the model
    kept; the run itself went down with cryptography's InvalidTag."""
    before = build(from_dict({**BASE, "privacy": {**DP, **SECAGG}}), data).initial_params
    got = _tampered(
        data, monkeypatch, "share_keys", 3, lambda t: {**t, "ct": torch.zeros_like(t["ct"])}
    )
    assert torch.equal(got.params, before)
    assert [r for r, _ in got.skipped] == [0, 1]
    assert all("unmask" in why for _, why in got.skipped), got.skipped


class _Counting(SimulationEngine):
    """A serial engine that counts every byte the server sends: the payload once
    per client trained, and each phase message."""

    name = "counting"

    def __init__(self, inner: Engine) -> None:
        self.inner, self.down, self.trained, self.uploads = inner, 0, 0, 0

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        self.down += len(payload) * len(tasks)
        self.trained += len(tasks)
        for upload in self.inner.run_cohort(tasks, payload):
            self.uploads += 1
            yield upload

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        self.down += sum(len(m) for m in messages.values())
        return self.inner.run_phase(phase, messages)


@pytest.mark.parametrize("phase", ["advertise", "share_keys", "masked_input", "unmask"])
def test_bytes_down_are_what_reached_the_clients(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    """A client that drops before masked input never gets the model: the round's
    bytes down are the payloads and phase messages the engine really carried (it
    charged the payload to the whole cohort)."""
    engines: list[_Counting] = []

    def counting(engine: Engine) -> _Counting:
        engines.append(_Counting(engine))
        return engines[-1]

    wrap_engine(monkeypatch, counting)
    got = _run(data, {**SECAGG, f"secagg_drop_{phase}": 0.34}, rounds=1)
    assert got.rounds[0].bytes_down == engines[0].down
    # dense float32: the model to each client trained, a masked update from each
    size = 199_210  # the 2NN's parameters
    assert engines[0].trained == (6 if phase == "unmask" else 4)
    assert got.rounds[0].float32_down == 4 * size * engines[0].trained
    assert got.rounds[0].float32_up == 4 * size * engines[0].uploads


def test_a_cohort_of_one_is_not_summed_in_the_clear(data: FederatedData) -> None:
    got = _run(data, SECAGG, client_fraction=0.17, rounds=1)  # round(0.17 x 6) = 1
    assert got.rounds[0].cohort_size == 1
    assert [why for _, why in got.skipped] == [
        "secure aggregation: 1 client(s) in the round; it needs at least 2"
    ]
    assert torch.equal(got.params, build(from_dict(BASE), data).initial_params)


def test_a_diverged_client_drops_out_instead_of_summing_as_zero(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NaN update became INT64_MIN in fixed point, 0 after the mask: summed as
    a zero update, its client still in the mean's denominator. It now sends no
    masked input: a dropout, refused by name, and the mean is over the others."""
    from fedforge.privacy.secagg_codec import SecAggCodec

    real = SecAggCodec.encode

    def diverged(self: SecAggCodec, delta: torch.Tensor, ctx: Any = None) -> Any:
        return real(self, delta * float("nan") if ctx.client_id == 2 else delta, ctx)

    monkeypatch.setattr(SecAggCodec, "encode", diverged)
    got = _run(data, SECAGG, rounds=1)
    assert [(c, why) for _, c, why in got.rejected] == [
        (2, "secure aggregation: no masked input: the update is not finite")
    ]
    assert not got.skipped and torch.isfinite(got.params).all()


def test_the_secure_collector_refuses_messages_out_of_turn(data: FederatedData) -> None:
    """SecureSum fed by hand, as a server is from the network: a reply before any
    phase, a masked update during key sharing, a second reply, anything after
    the round: each refused with a reason, no crash, and the sum unchanged."""
    from fedforge.report.progress import Progress
    from fedforge.server.cohort import sample
    from fedforge.server.collect import collect
    from fedforge.server.collectors.base import RoundLog
    from fedforge.server.round import collector_for, configure
    from fedforge.server.state import LoopState

    cfg = from_dict({**BASE, "privacy": {**DP, **SECAGG}})
    exp = build(cfg, data)
    state = LoopState.fresh(exp)
    log = RoundLog(state.rejected, state.skipped, Progress(1, "t", enabled=False), 0)
    orders = configure(exp, state, 0, 0, sample(exp, 0))
    secure = collector_for(exp, orders, log, None)
    secure.reply(0, b"early")  # no phase under way
    secure.end_phase()  # nothing to close: no effect
    phase = secure.next_phase()
    assert phase is not None and phase.name == "advertise"
    replies = exp.engine.run_phase(phase.name, phase.messages)
    for c, r in replies.items():
        secure.reply(c, r)
    secure.reply(0, replies[0])  # a second reply: the first stands
    assert secure.offer(1, b"too early") is not None
    secure.end_phase()
    got = collect(exp, secure, orders.tasks, orders.payload, 0)
    assert got.aggregate is not None and sorted(got.clients) == list(range(6))
    assert secure.next_phase() is None  # the round is over
    secure.reply(2, b"late")
    assert secure.offer(2, b"late") is not None
    reasons = [why for _, _, why in state.rejected]
    assert len(reasons) == 5 and all(why.startswith("secure aggregation: ") for why in reasons)
    assert "second reply to 'advertise'" in reasons[1]
    assert "masked update was not asked for now" in reasons[2]
    clean_state = LoopState.fresh(exp)
    clean_log = RoundLog([], [], Progress(1, "t", enabled=False), 0)
    clean = collect(
        exp, collector_for(exp, orders, clean_log, None), orders.tasks, orders.payload, 0
    )
    assert clean.aggregate is not None and torch.equal(got.aggregate, clean.aggregate)
    assert clean_state.rejected == []

"""Distributed DP and privacy tiers: each client's noise has the stated std and
the sum of n carries n sigma^2 / n_min; distributed DP is accounted as
dp-accounting's central Gaussian for the same events; the fixed-point modulus
grows for the noise; refusals; high-tier clients' updates carry local noise and
low-tier ones none (on the client stage outputs of real rounds), and the masks
still cancel exactly over the noised fixed-point inputs."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import rdp
from tests.conftest import MakeData
from tests.test_privacy_secagg_round import BASE  # the same tiny 2NN secure-aggregation run

from fedforge.config import from_dict
from fedforge.core.errors import ConfigError, UploadError
from fedforge.data.federated import FederatedData
from fedforge.pipeline.clip import Clip
from fedforge.pipeline.pipeline import Pipeline, StageContext
from fedforge.privacy import secagg_codec as sc
from fedforge.privacy import secagg_wire as sw
from fedforge.privacy.accountant import RDP_ORDERS
from fedforge.privacy.dp import DistributedNoise, DPMean
from fedforge.privacy.secagg import SecAggClient
from fedforge.privacy.secagg_masks import FixedPoint, modulus_bits
from fedforge.privacy.tiers import TieredNoise, high_tier
from fedforge.server.collectors import secure
from fedforge.server.experiment import build
from fedforge.server.loop import run
from fedforge.server.summary import format_summary

SIZES = [30, 20, 40, 30, 25, 35]
Z, CLIP = 0.8, 0.5
DIST = {"dp": "distributed", "noise_multiplier": Z, "clip_norm": CLIP, "secagg": True}
TIERS = {"noise_multiplier": Z, "clip_norm": CLIP, "secagg": True}


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data(SIZES)


def _variance_ok(sample: torch.Tensor, std: float) -> None:
    """n normal draws: the sample variance has std sigma^2 sqrt(2 / (n - 1)) and the
    mean sigma / sqrt(n); allow 5 of each (fixed seeds: deterministic anyway)."""
    n = sample.numel()
    assert abs(float(sample.var()) - std**2) < 5 * std**2 * math.sqrt(2 / (n - 1))
    assert abs(float(sample.mean())) < 5 * std / math.sqrt(n)


# ------------------------------------------------------------------ the noise
def test_distributed_noise_per_client_std_and_the_sums_variance() -> None:
    n, n_min, p = 6, 4, 100_000
    stage = DistributedNoise(1.2, 0.8, n_min)
    sigma = 1.2 * 0.8
    zero = torch.zeros(p, dtype=torch.float64)
    draws = [stage.apply(zero, StageContext(3, 7, client_id=c)) for c in range(n)]
    for d in draws:
        _variance_ok(d, sigma / math.sqrt(n_min))
    assert not torch.equal(draws[0], draws[1])  # one generator per client
    _variance_ok(torch.stack(draws).sum(0), math.sqrt(n * sigma**2 / n_min))
    # n = n_min survivors: exactly the central noise sigma on the sum
    _variance_ok(torch.stack(draws[:n_min]).sum(0), sigma)
    assert torch.equal(draws[2], stage.apply(zero, StageContext(3, 7, client_id=2)))


def test_tiered_noise_only_on_the_high_tier() -> None:
    stage = TieredNoise(2.0, 0.5, {1, 3})
    vec = torch.linspace(-0.1, 0.1, 50_000, dtype=torch.float64)
    for c in range(5):
        out = stage.apply(vec, StageContext(0, 1, client_id=c))
        if c in (1, 3):
            _variance_ok(out - vec, 1.0)  # z C
        else:
            assert torch.equal(out, vec)


def test_high_tier_is_drawn_from_the_seed_or_listed() -> None:
    a = high_tier(100, 0.3, (), seed=5)
    assert len(a) == 30 and a == high_tier(100, 0.3, (), seed=5)
    assert a != high_tier(100, 0.3, (), seed=6)
    assert high_tier(10, 0.0, (2, 7), seed=0) == {2, 7}
    with pytest.raises(ConfigError, match=r"high_clients.*0\.\.9"):
        high_tier(10, 0.0, (2, 10), seed=0)


# -------------------------------------------------------------- accounting
@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_distributed_epsilon_equals_dp_accountings_central_gaussian(
    make_data: MakeData, one_thread: None, sampling: str
) -> None:
    """Six clients, C = 0.5: three a round (fixed) or each with probability 0.5."""
    data = make_data(SIZES)
    cfg = {
        **BASE,
        "client_fraction": 0.5,
        "rounds": 3,
        "privacy": {**DIST, "sampling": sampling, "delta": 1e-3, "secagg_threshold": 0.6},
    }
    exp = build(from_dict(cfg), data)
    assert exp.privacy is not None
    # replace-one (fixed cohorts) doubles the sum's sensitivity: multiplier Z / 2
    gauss = dpa.GaussianDpEvent(Z / 2 if sampling == "fixed" else Z)
    if sampling == "fixed":
        event: dpa.DpEvent = dpa.SampledWithoutReplacementDpEvent(6, 3, gauss)
        ref = rdp.RdpAccountant(
            [o for o in RDP_ORDERS if float(o).is_integer()], dpa.NeighboringRelation.REPLACE_ONE
        )
    else:
        event = dpa.PoissonSampledDpEvent(0.5, gauss)
        ref = rdp.RdpAccountant(RDP_ORDERS)
    ref.compose(event, 3)
    assert exp.privacy.epsilon(3) == pytest.approx(ref.get_epsilon(1e-3), rel=1e-9)
    central = build(from_dict({**cfg, "privacy": {**cfg["privacy"], "dp": "central"}}), data)
    assert central.privacy is not None
    assert exp.privacy.epsilon(3) == central.privacy.epsilon(3)
    # against the server, which drew the cohorts: no amplification; the worst
    # client's participations compose a Gaussian of multiplier Z / 2
    from fedforge.selection.sampling import sample_cohort

    count = [0] * 6
    for t in range(3):
        for c in sample_cohort(6, 0.5, 0, t, sampling == "poisson"):
            count[c] += 1
    server = rdp.RdpAccountant(RDP_ORDERS)
    server.compose(dpa.GaussianDpEvent(Z / 2), max(count))
    vs_server = exp.privacy.summary(3)["epsilon_vs_server"]
    assert vs_server == pytest.approx(server.get_epsilon(1e-3), rel=1e-6)
    assert vs_server > exp.privacy.epsilon(3)  # sampling amplified only the other figure
    # the pipeline: the clients noise, the server adds nothing
    assert "clip -> distributed_dp -> encode:secagg" in exp.pipeline.describe()
    assert "central_dp" not in exp.pipeline.describe()


# ------------------------------------------------------------------ modulus
def test_modulus_grows_for_the_noise(data: FederatedData) -> None:
    """n_min = ceil(0.66 * 6) = 4: each coordinate is clamped at C + 8 z C / 2."""
    exp = build(from_dict({**BASE, "privacy": {**DIST, "secagg_frac_bits": 20}}), data)
    assert exp.privacy is not None and exp.privacy.secagg is not None
    codec = exp.privacy.secagg
    assert codec.min_survivors == 4 and codec.threshold_of(6) == 4
    assert codec.bound == pytest.approx(CLIP + 8 * Z * CLIP / 2)
    # 6 (2.1 * 2^20 + 0.5) < 2^24: k = 25, two bits over the clip bound alone
    assert codec.fp.bits == modulus_bits(CLIP * (1 + 4 * Z), 6, 20) == 25
    assert modulus_bits(CLIP, 6, 20) == 23
    fp = codec.fp
    worst = sum(fp.encode(np.full(2, codec.bound)) for _ in range(6)) & fp.mask
    assert np.allclose(fp.decode(worst), 6 * codec.bound)
    assert sc.clamp_probability(1.0) == pytest.approx(1.2442e-15, rel=1e-3)
    with pytest.raises(ConfigError, match="64"):  # the noise's bits do not fit
        build(
            from_dict({**BASE, "privacy": {**DIST, "clip_norm": 1e6, "secagg_frac_bits": 40}}), data
        )


def test_a_client_refuses_a_threshold_below_n_min(data: FederatedData) -> None:
    exp = build(from_dict({**BASE, "privacy": DIST}), data)
    assert exp.privacy is not None and exp.privacy.secagg is not None
    codec = exp.privacy.secagg
    keys = {}
    for c in range(6):
        msg = codec.phase("advertise", c, sw.advertise_message(0))
        assert msg is not None
        keys[c] = sw.read_keys(msg, 0, c)
    # it aborts the round (an abort note: a dropout to the server) and forgets its keys
    note = codec.phase("share_keys", 0, sw.share_keys_message(0, keys, 3))
    assert note is not None
    with pytest.raises(UploadError, match="client 0 aborted the round: threshold 3 is below"):
        sw.read_shares(note, 0, 0, list(range(6)))
    assert "threshold 3 is below" in codec.aborted[0]
    assert 0 not in codec.sessions


def test_rounds_with_fewer_clients_than_n_min_are_skipped(data: FederatedData) -> None:
    """Stragglers dropped: 3 of 6 clients train, fewer than n_min = 4."""
    cfg = {**BASE, "local_epochs": 2, "stragglers": {"fraction": 0.5, "drop": True}}
    result = run(from_dict({**cfg, "privacy": DIST}), data, store=False)
    assert [r for r, _ in result.skipped] == [0, 1]
    assert all("n_min" in why for _, why in result.skipped)


@pytest.mark.parametrize(
    ("priv", "more", "match"),
    [
        ({**DIST, "secagg": False}, {}, "needs privacy.secagg = true"),
        ({**DIST, "weights": "capped", "weight_cap": 30}, {}, "shrink that client's noise"),
        ({**DIST, "noise_multiplier": 0.0}, {}, "no noise"),
        ({**DIST, "adaptive_clip": True}, {}, "adaptive_clip"),
        (DIST, {"robust": {"aggregator": "median"}}, "robust.aggregator"),
        ({**TIERS, "tiers": {"high_fraction": 0.5}, "secagg": False}, {}, "need privacy.secagg"),
        ({**TIERS, "tiers": {"high_fraction": 0.5}, "dp": "local"}, {}, "tiers set each"),
        ({**TIERS, "tiers": {"high_fraction": 0.5, "high_clients": [1]}}, {}, "not both"),
        ({**TIERS, "tiers": {"high_clients": [1, 6]}}, {}, "client ids in 0..5"),
        ({**TIERS, "tiers": {"high_fraction": 1.5}}, {}, r"\[0, 1\]"),
        (
            {**TIERS, "tiers": {"high_fraction": 0.5}},
            {"communication": {"clip_norm": 1.0}},
            "both clip",
        ),
    ],
)
def test_refusals(
    data: FederatedData, priv: dict[str, Any], more: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        build(from_dict({**BASE, **more, "privacy": priv}), data)


def test_the_pipeline_refuses_distributed_noise_without_masking() -> None:
    clip, noise = Clip(1.0), DistributedNoise(1.0, 1.0, 4)
    with pytest.raises(ConfigError, match="without secure aggregation"):
        Pipeline(DPMean(1.0), client=(clip, noise))
    with pytest.raises(ConfigError, match="'distributed_dp' comes before 'clip'"):
        Pipeline(DPMean(1.0), client=(noise, clip))


# ------------------------------------------------- real rounds, spied upon
class _Spy:
    """Records each client's clipped delta (the Clip stage's output), the vector
    secure aggregation encodes (after the noise stage and the codec's clamp), and
    the unmasked sums."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clipped: dict[tuple[int, int], torch.Tensor] = {}
        self.inputs: dict[tuple[int, int], np.ndarray] = {}
        self.totals: list[tuple[int, list[int], np.ndarray]] = []
        clip_apply, masked_input, unmask_sum = (
            Clip.apply,
            SecAggClient.masked_input,
            secure.unmask_sum,
        )

        def clip(stage: Clip, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
            out = clip_apply(stage, vec, ctx)
            self.clipped[(ctx.round_idx, ctx.client_id or 0)] = out.clone()
            return out

        def mask(client: SecAggClient, x: np.ndarray) -> np.ndarray:
            self.inputs[(client.round, client.id)] = x.copy()
            return masked_input(client, x)

        def unmask(
            masked: Any,
            replies: Any,
            keys: Any,
            u2: Any,
            t: int,
            fp: FixedPoint,
            round_idx: int,
            size: int,
        ) -> Any:
            total, why = unmask_sum(masked, replies, keys, u2, t, fp, round_idx, size)
            if total is not None:
                self.totals.append((round_idx, sorted(masked), total.copy()))
            return total, why

        monkeypatch.setattr(Clip, "apply", clip)
        monkeypatch.setattr(SecAggClient, "masked_input", mask)
        monkeypatch.setattr(secure, "unmask_sum", unmask)

    def noise(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(round, client, what was added after clipping) for every masked input."""
        for (r, c), x in sorted(self.inputs.items()):
            yield r, c, torch.from_numpy(x) - self.clipped[(r, c)]

    def check_masks_cancel(self, fp: FixedPoint) -> None:
        """The unmasked sum is the plain integer sum of the noised fixed-point inputs."""
        assert self.totals
        for r, u3, total in self.totals:
            plain = np.zeros_like(total)
            for c in u3:
                plain = plain + fp.encode(self.inputs[(r, c)])
            assert np.array_equal(total, plain & fp.mask)


def test_distributed_round_noise_and_exact_unmasking(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One client drops after its masked input (5 survivors, n_min 4)."""
    spy = _Spy(monkeypatch)
    cfg = from_dict({**BASE, "privacy": {**DIST, "secagg_drop_unmask": 0.17}})
    result = run(cfg, data, store=False)
    assert not result.skipped
    exp = build(cfg, data)
    assert exp.privacy is not None and exp.privacy.secagg is not None
    codec = exp.privacy.secagg
    spy.check_masks_cancel(codec.fp)
    assert len(spy.inputs) == 12
    for _, _, added in spy.noise():
        _variance_ok(added, Z * CLIP / math.sqrt(4))
        assert float(added.abs().max()) < codec.bound - CLIP  # the clamp never bound
    summary = result.summary["privacy"]
    assert summary["min_survivors"] == 4
    assert summary["client_noise_std"] == pytest.approx(Z * CLIP / 2)
    assert "dp distributed (n_min 4" in format_summary(result.summary)


def test_tiers_noise_the_high_tier_only_and_report_per_tier(
    data: FederatedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(monkeypatch)
    priv = {**TIERS, "tiers": {"high_clients": [1, 4]}, "delta": 1e-3}
    cfg = from_dict({**BASE, "privacy": priv})
    result = run(cfg, data, store=False)
    exp = build(cfg, data)
    assert exp.privacy is not None and exp.privacy.secagg is not None
    assert "clip -> tiered_dp -> encode:secagg" in exp.pipeline.describe()
    assert exp.privacy.secagg.bound == pytest.approx(CLIP * (1 + 8 * Z))
    spy.check_masks_cancel(exp.privacy.secagg.fp)
    seen = set()
    for _, c, added in spy.noise():
        seen.add(c)
        if c in (1, 4):
            _variance_ok(added, Z * CLIP)
        else:
            assert torch.equal(added, torch.zeros_like(added))  # clipped, masked, no noise
    assert seen == set(range(6))
    # every client is in both rounds: each high-tier client's Gaussian composed twice
    ref = rdp.RdpAccountant(RDP_ORDERS)
    ref.compose(dpa.GaussianDpEvent(Z / 2), 2)  # local DP: any two inputs, 2C apart
    eps = ref.get_epsilon(1e-3)
    s = result.summary["privacy"]
    assert s["high_clients"] == [1, 4]
    assert s["tiers"]["high"]["clients"] == 2 and s["tiers"]["low"]["clients"] == 4
    assert s["tiers"]["high"]["local_epsilon_max"] == pytest.approx(eps, rel=1e-9)
    assert s["local_epsilon"] == {"1": pytest.approx(eps), "4": pytest.approx(eps)}
    assert s["epsilon"] == pytest.approx(eps)
    assert "no DP noise" in s["tiers"]["low"]["applied"]
    text = format_summary(result.summary)
    assert "privacy          tier high, 2 clients" in text
    assert "privacy          tier low, 4" in text

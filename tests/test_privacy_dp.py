"""Differential privacy: the noise has the stated variance, the accountant equals
dp-accounting's for the same events, calibration inverts it, target_epsilon
refuses to start or stops, and a tiny central-DP run records epsilon per round."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import pld, rdp
from tests.conftest import MakeData

from fedforge.config import from_dict
from fedforge.core.errors import ConfigError
from fedforge.pipeline.pipeline import StageContext
from fedforge.privacy.accountant import (
    RDP_INT_ORDERS,
    RDP_ORDERS,
    Accountant,
    calibrate_noise,
    local_epsilon,
)
from fedforge.privacy.dp import CentralNoise, DPMean, LocalNoise, next_clip_norm
from fedforge.server.loop import run
from fedforge.store import RunStore

BASE: dict[str, Any] = {
    "model": "2nn",
    "num_clients": 6,
    "client_fraction": 0.5,
    "batch_size": 10,
    "lr": 0.05,
    "rounds": 3,
    "target_accuracy": None,
    "dtype": "float64",
}


def _variance_ok(sample: torch.Tensor, std: float) -> None:
    """The sample variance of n normal draws has std sigma^2 sqrt(2 / (n - 1)):
    allow 5 of those (a fixed seed, so the test is deterministic anyway)."""
    n = sample.numel()
    tol = 5 * std**2 * math.sqrt(2 / (n - 1))
    assert abs(float(sample.var()) - std**2) < tol
    assert abs(float(sample.mean())) < 5 * std / math.sqrt(n)


def test_central_noise_has_the_stated_variance() -> None:
    z, clip, d = 1.3, 0.7, 5.0
    stage = CentralNoise(z, clip, d)
    vec = torch.zeros(200_000, dtype=torch.float64)
    out = stage.apply(vec, StageContext(3, seed=11))
    _variance_ok(out, z * clip / d)  # z C on the sum, z C / D on the mean
    again = stage.apply(vec, StageContext(3, seed=11))
    assert torch.equal(out, again)  # derived generator: reproducible


def test_local_noise_has_the_stated_variance_and_differs_per_client() -> None:
    stage = LocalNoise(2.0, 0.5)
    vec = torch.zeros(100_000, dtype=torch.float64)
    a = stage.apply(vec, StageContext(0, 1, client_id=1))
    b = stage.apply(vec, StageContext(0, 1, client_id=2))
    _variance_ok(a, 1.0)
    assert not torch.equal(a, b)


def test_secret_noise_has_the_stated_variance_and_never_repeats() -> None:
    vec = torch.zeros(100_000, dtype=torch.float64)
    for stage, std in (
        (CentralNoise(1.3, 0.7, 5.0, secret=True), 1.3 * 0.7 / 5.0),
        (LocalNoise(2.0, 0.5, secret=True), 1.0),
    ):
        ctx = StageContext(3, seed=11, client_id=1)
        a, b = stage.apply(vec, ctx), stage.apply(vec, ctx)
        _variance_ok(a, std)
        _variance_ok(b, std)
        assert not torch.equal(a, b)  # same seed, round and client: not the same noise


@pytest.mark.parametrize("secret", [None, False, True])
def test_who_knows_the_seed_strips_derived_noise_but_not_secret_noise(
    make_data: MakeData, one_thread: None, monkeypatch: pytest.MonkeyPatch, secret: bool | None
) -> None:
    """Local DP, the server's view: it knows the run seed, the round and the client,
    so it can draw derived noise again and subtract it (the clipped update comes
    back to rounding: why ``secret_noise`` exists); secret noise stays on. A
    simulation's default (None) is derived noise: runs repeat bit for bit."""
    import fedforge.server.collectors.intake as round_module
    from fedforge.core.rng import torch_generator
    from fedforge.privacy.dp import gaussian

    z, clip = 4.0, 0.3
    data = make_data([30, 20, 40, 30, 25, 35])
    cfg = from_dict(
        {
            "model": "2nn", "num_clients": 6, "client_fraction": 0.5, "rounds": 1,
            "target_accuracy": None, "dtype": "float64", "seed": 7,
            "privacy": {"dp": "local", "noise_multiplier": z, "clip_norm": clip,
                        "secret_noise": secret},
        }
    )  # fmt: skip
    seen: dict[int, torch.Tensor] = {}
    check = round_module.check_form

    def spy(form: Any, codec: Any, client_id: int, round_idx: int, data_: bytes) -> Any:
        up = check(form, codec, client_id, round_idx, data_)
        seen[client_id] = up.delta.clone()  # what the server receives
        return up

    monkeypatch.setattr(round_module, "check_form", spy)
    run(cfg, data, store=False)
    noised = dict(seen)
    monkeypatch.setattr(LocalNoise, "apply", lambda self, vec, ctx: vec)
    run(cfg, data, store=False)  # the same clients, clipped updates without noise
    assert sorted(seen) == sorted(noised) and len(seen) == 3
    for c, d in noised.items():
        stripped = d - gaussian(d, z * clip, torch_generator(7, "local_dp", 0, c))
        error = float((stripped - seen[c]).abs().max())
        if secret:
            assert error > z * clip  # N(0, 2 (z C)^2) a coordinate, 199,210 of them
        else:
            assert error < 1e-12


def test_dp_mean_caps_weights_and_uses_a_fixed_denominator() -> None:
    u = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    agg = DPMean(4.0, weight_cap=10)
    out = agg.aggregate(u, torch.tensor([5.0, 1000.0]))
    assert torch.allclose(out, torch.tensor([0.5 / 4, 1.0 / 4], dtype=torch.float64))
    acc = agg.start(2, torch.float64)
    acc.add(u[0], 5.0)
    acc.add(u[1], 1000.0)
    assert torch.equal(acc.result(), out)


def test_adaptive_clip_moves_towards_the_quantile() -> None:
    gen = torch.Generator().manual_seed(0)
    # all 10 unclipped: b = 1 > gamma = 0.5, so C shrinks by about exp(-0.2 * 0.5)
    c = next_clip_norm(1.0, 10, 10, 10.0, 1e-9, 0.5, 0.2, gen)
    assert c == pytest.approx(math.exp(-0.1))
    c = next_clip_norm(1.0, 0, 10, 10.0, 1e-9, 0.5, 0.2, gen)
    assert c == pytest.approx(math.exp(0.1))
    # Poisson: 12 clients came where 10 were expected, 6 of them unclipped. The
    # centred count (6 - 12/2) / 10 + 1/2 = 0.5 is the target: C stays; the plain
    # count (6 / 10 = 0.6) would shrink it, and moves by 1 (not 1/2) per client.
    assert next_clip_norm(1.0, 6, 12, 10.0, 1e-9, 0.5, 0.2, gen) == pytest.approx(1.0)


def test_the_count_noise_needs_more_than_half_the_noise_multiplier() -> None:
    """z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2 exists for sigma_b > z / 2 (the
    message said 1 / (2 z): 0.005 for z = 100, where the bound is 50)."""
    from fedforge.privacy.dp import update_noise_multiplier

    with pytest.raises(ValueError, match="need clip_count_std > z / 2 = 50"):
        update_noise_multiplier(100.0, 1.0)
    assert update_noise_multiplier(100.0, 51.0) == pytest.approx((1e-4 - 102.0**-2) ** -0.5)
    with pytest.raises(ValueError):
        update_noise_multiplier(100.0, 50.0)  # exactly z / 2: no budget left


@pytest.mark.parametrize(
    "sampling,kind", [("fixed", "rdp"), ("poisson", "rdp"), ("poisson", "pld")]
)
def test_accountant_equals_dp_accounting(sampling: Any, kind: Any) -> None:
    acc = Accountant(1.1, 1000, 50, 1e-5, kind, sampling)
    # replace-one (fixed cohorts): the sum's sensitivity is 2C, so std 1.1 C is a
    # multiplier of 0.55 in dp-accounting's terms (std over sensitivity)
    gauss = dpa.GaussianDpEvent(1.1 / 2 if sampling == "fixed" else 1.1)
    if sampling == "poisson":
        event: dpa.DpEvent = dpa.PoissonSampledDpEvent(0.05, gauss)
    else:
        event = dpa.SampledWithoutReplacementDpEvent(1000, 50, gauss)
    if kind == "pld":
        ref: dpa.PrivacyAccountant = pld.PLDAccountant()
    elif sampling == "fixed":
        ref = rdp.RdpAccountant(RDP_INT_ORDERS, dpa.NeighboringRelation.REPLACE_ONE)
    else:
        ref = rdp.RdpAccountant(RDP_ORDERS)
    ref.compose(event, 30)
    assert acc.epsilon(30) == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
    assert acc.epsilon(10) < acc.epsilon(30)


def _sampled_gaussian_epsilon(z: float, q: float, rounds: int, delta: float) -> float:
    """Poisson-sampled Gaussian written out, not through dp-accounting: at integer
    orders a its RDP is log(A_a) / (a - 1), A_a = sum_k C(a, k) (1 - q)^(a - k)
    q^k exp((k^2 - k) / (2 z^2)) (Mironov, Talwar and Zhang 2019, section 3.3),
    times the rounds; to (epsilon, delta) by Canonne, Kamath and Steinke 2020:
    rdp + log((a - 1) / a) - (log delta + log a) / (a - 1), least over a <= 256."""
    best = math.inf
    for a in range(2, 257):
        terms = [
            math.lgamma(a + 1) - math.lgamma(k + 1) - math.lgamma(a - k + 1)
            + (a - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * z * z)
            for k in range(a + 1)
        ]  # fmt: skip
        top = max(terms)
        log_a = top + math.log(sum(math.exp(t - top) for t in terms))
        rdp_a = rounds * log_a / (a - 1)
        eps = rdp_a + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        best = min(best, eps)
    return best


@pytest.mark.parametrize(
    ("z", "n", "m", "rounds"), [(1.1, 1000, 50, 30), (0.8, 1000, 100, 100), (2.0, 10000, 100, 500)]
)
def test_poisson_epsilon_against_the_sampled_gaussian_written_out(
    z: float, n: int, m: int, rounds: int
) -> None:
    """The accountant's orders include fractional ones, so its epsilon is at most
    the integer-order figure; where the best order is an integer (the last case)
    the two agree to rounding."""
    got = Accountant(z, n, m, 1e-5, "rdp", "poisson").epsilon(rounds)
    want = _sampled_gaussian_epsilon(z, m / n, rounds, 1e-5)
    assert got <= want * (1 + 1e-9)
    assert got > 0.85 * want
    if z == 2.0:
        assert got == pytest.approx(want, rel=1e-9)


def test_local_epsilon_and_calibration() -> None:
    ref = rdp.RdpAccountant(RDP_ORDERS)
    ref.compose(dpa.GaussianDpEvent(3.0 / 2), 4)  # any two inputs: sensitivity 2C
    assert local_epsilon(3.0, 4, 1e-5) == pytest.approx(ref.get_epsilon(1e-5))
    z = calibrate_noise(2.0, 1e-5, 50, 0.02, num_clients=5000, sampling="poisson")
    eps = Accountant(z, 5000, 100, 1e-5, "rdp", "poisson").epsilon(50)
    assert eps <= 2.0 and eps > 1.95
    # by default as a run samples: a fixed cohort (replace-one), so more noise
    fixed = calibrate_noise(2.0, 1e-5, 50, 0.02, num_clients=5000)
    eps = Accountant(fixed, 5000, 100, 1e-5, "rdp", "fixed").epsilon(50)
    assert eps <= 2.0 and eps > 1.95 and fixed > 1.5 * z


def test_poisson_is_accounted_at_the_client_fraction_itself() -> None:
    """C N = 1.9 clients: the sampler takes each client with probability C = 0.1;
    the accountant took q = floor(1.9) / 19 (epsilon 1.99 against 3.75 after 43
    rounds; the run passed its target at round 9). Against dp-accounting at q."""
    acc = Accountant(1.0, 19, 1, 1e-3, "rdp", "poisson", rate=0.1)
    ref = rdp.RdpAccountant(RDP_ORDERS)
    ref.compose(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.0)), 43)
    assert acc.epsilon(43) == pytest.approx(ref.get_epsilon(1e-3), rel=1e-9)
    assert acc.epsilon(43) > 3.5


def _gaussian_epsilon(s: float, delta: float) -> float:
    """The exact epsilon(delta) of the Gaussian mechanism whose noise std is ``s``
    times its L2 sensitivity (Balle and Wang 2018, Theorem 8):
    delta = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s), solved by bisection."""

    def phi(x: float) -> float:
        return 0.5 * math.erfc(-x / math.sqrt(2))

    def delta_of(eps: float) -> float:
        return phi(1 / (2 * s) - eps * s) - math.exp(eps) * phi(-1 / (2 * s) - eps * s)

    lo, hi = 0.0, 200.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("z,rounds", [(2.0, 5), (1.0, 1), (4.0, 20)])
def test_replace_one_epsilon_bounds_the_exact_gaussian(z: float, rounds: int) -> None:
    """Independent of dp-accounting: with every client in every round (no sampling
    to amplify) T rounds of std z C on a sum of updates clipped to C are one
    Gaussian mechanism of std z C / sqrt(T) per unit of sensitivity. Swapping one
    client's update u for u' (replace-one, fixed cohorts) moves the sum by up to
    ||u - u'|| = 2C, adding or removing one (Poisson) by C. RDP's epsilon is an
    upper bound: it must not fall below the exact one, and is within 1.6x of it."""
    delta = 1e-5
    fixed = Accountant(z, 10, 10, delta, "rdp", "fixed").epsilon(rounds)
    exact = _gaussian_epsilon(z / 2 / math.sqrt(rounds), delta)
    assert exact <= fixed <= 1.6 * exact
    poisson = Accountant(z, 10, 10, delta, "rdp", "poisson").epsilon(rounds)
    exact_add_remove = _gaussian_epsilon(z / math.sqrt(rounds), delta)
    assert exact_add_remove <= poisson <= 1.6 * exact_add_remove
    local = local_epsilon(z, rounds, delta)  # any two inputs of a client: 2C apart
    assert exact <= local <= 1.6 * exact


def test_target_epsilon_refuses_to_start_then_stops(
    make_data: MakeData, one_thread: None, tmp_path: Path
) -> None:
    data = make_data([30, 20, 40, 30, 25, 35])
    priv = {"dp": "central", "noise_multiplier": 3.0, "delta": 1e-3, "target_epsilon": 0.1}
    with pytest.raises(ConfigError, match="first round"):
        run(from_dict({**BASE, "privacy": priv}), data, store=False)
    budget = {**priv, "target_epsilon": 3.0}
    cfg = from_dict(
        {**BASE, "runs_dir": str(tmp_path), "evaluation": {"every": 5}, "privacy": budget}
    )
    acc = Accountant(3.0, 6, 3, 1e-3)  # epsilon 1.7, 2.7, 3.6 after rounds 1, 2, 3
    allowed = max(t for t in range(4) if acc.epsilon(t) <= 3.0)
    result = run(cfg, data)
    assert len(result.rounds) == allowed < 3
    assert "privacy budget" in result.summary["privacy_stop"]
    # the model the run ends with is evaluated, though no evaluation.every round came
    assert [r.test_accuracy is not None for r in result.rounds] == [False] * (allowed - 1) + [True]
    from fedforge.core.params import ParamSpec
    from fedforge.models import build_model

    model = build_model("2nn", 0, torch.float64)
    ParamSpec.of(model).load_into(model, result.params)
    with torch.no_grad():
        right = (model(data.test_x).argmax(dim=1) == data.test_y).double().mean().item()
    assert result.summary["final_accuracy"] == pytest.approx(right, abs=1e-12)
    with RunStore.open(result.run_dir or "") as store:
        rows = store.privacy()
    assert [r[1] for r in rows] == pytest.approx([acc.epsilon(t + 1) for t in range(allowed)])


def test_central_dp_run_equals_clipped_mean_plus_noise(
    make_data: MakeData, one_thread: None
) -> None:
    """z -> tiny: the DP run approaches the clipped uniform-mean run; the pipeline
    says what ran."""
    data = make_data([30, 20, 40, 30, 25, 35])
    priv = {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 0.3}
    result = run(from_dict({**BASE, "privacy": priv}), data, store=False)
    assert "clip -> encode" in result.summary["pipeline"]
    assert "dp_mean -> central_dp" in result.summary["pipeline"]
    assert result.summary["privacy"]["epsilon"] == pytest.approx(
        Accountant(1.0, 6, 3, 6**-1.1).epsilon(3)
    )
    with pytest.raises(ConfigError, match="robust.aggregator"):
        from fedforge.server.experiment import build

        build(from_dict({**BASE, "privacy": priv, "robust": {"aggregator": "median"}}), data)


@pytest.mark.parametrize(
    ("extra", "match"),
    [  # SCAFFOLD's control deltas are the raw update rescaled, sent in the clear
        ({"algorithm": "scaffold", "privacy": {"dp": "central"}}, "control_delta beside"),
        ({"algorithm": "scaffold", "privacy": {"dp": "local"}}, "control_delta beside"),
        # a lossy codec after the clip: the server's sum may exceed the clip norm
        ({"privacy": {"dp": "central"}, "communication": {"uplink": "int2"}}, "'int2' cannot"),
        (
            {"privacy": {"dp": "central"}, "communication": {"uplink": "topk", "fraction": 0.1}},
            "'topk' cannot",
        ),
        ({"privacy": {"dp": "local", "noise_multiplier": 0}}, "no noise gives no privacy"),
        ({"privacy": {"dp": "central", "delta": 0.5}}, r"'privacy.delta' = 0.5.*below 1 / num"),
    ],
)
def test_privacy_refuses_what_would_break_its_guarantee(
    make_data: MakeData, extra: dict[str, Any], match: str
) -> None:
    from fedforge.server.experiment import build

    data = make_data([30, 20, 40, 30, 25, 35])
    with pytest.raises(ConfigError, match=match):
        build(from_dict({**BASE, **extra}), data)


def test_a_poisson_run_accounts_at_its_client_fraction(make_data: MakeData) -> None:
    from fedforge.server.experiment import build

    data = make_data([5] * 19)
    cfg = {**BASE, "num_clients": 19, "client_fraction": 0.1}
    exp = build(from_dict({**cfg, "privacy": {"dp": "central", "sampling": "poisson"}}), data)
    assert exp.privacy is not None and exp.privacy.accountant is not None
    want = Accountant(1.0, 19, 1, 19**-1.1, "rdp", "poisson", rate=0.1).epsilon(5)
    assert exp.privacy.epsilon(5) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("dp", ["central", "local"])
def test_upload_periods_spend_one_release_each(make_data: MakeData, dp: str) -> None:
    """upload_every = 5 over 10 rounds: two noised releases, not ten (central
    reported 10.49 where 2 releases cost 3.00); local DP counts each period's
    cohort once, sampled at the period's first round."""
    from fedforge.selection.sampling import sample_cohort
    from fedforge.server.experiment import build

    data = make_data([30, 20, 40, 30, 25, 35])
    cfg = {**BASE, "rounds": 10, "communication": {"upload_every": 5}}
    exp = build(from_dict({**cfg, "privacy": {"dp": dp}}), data)
    assert exp.privacy is not None
    assert exp.privacy.releases(10) == [0, 5] and exp.privacy.releases(4) == []
    delta = 6**-1.1
    if dp == "central":
        assert exp.privacy.epsilon(10) == Accountant(1.0, 6, 3, delta).epsilon(2)
        return
    counts: dict[int, int] = {}
    for start in (0, 5):
        for c in sample_cohort(6, 0.5, 0, start):
            counts[c] = counts.get(c, 0) + 1
    want = {c: local_epsilon(1.0, k, delta) for c, k in counts.items()}
    assert exp.privacy.local_epsilons(10) == dict(sorted(want.items()))


@pytest.mark.parametrize(
    ("priv", "hidden"),
    [({"dp": "local"}, True), ({"dp": "central"}, False)],
)
def test_a_server_that_must_not_see_updates_gets_no_training_loss(
    make_data: MakeData, tmp_path: Path, priv: dict[str, Any], hidden: bool
) -> None:
    """Under local DP the exact training loss travelled in clear beside the
    noised update (and was stored per client); the server of central DP is
    trusted with the updates, and still gets it."""
    data = make_data([30, 20, 40, 30, 25, 35])
    res = run(from_dict({**BASE, "rounds": 1, "runs_dir": str(tmp_path), "privacy": priv}), data)
    assert res.run_dir is not None
    with RunStore.open(res.run_dir) as store:
        losses = [c.train_loss for c in store.client_rounds(0)]
        assert len(losses) == 3
        assert all(loss is None for loss in losses) == hidden
        assert math.isnan(store.rounds()[0].train_loss) == hidden


def test_a_budget_stop_with_upload_periods_ends_on_an_evaluated_upload(
    make_data: MakeData, one_thread: None
) -> None:
    """Releases happen at a period's last round: the loop checked the budget
    round by round, ran the next period's local rounds for nothing, and the
    round that ended the run was never evaluated."""
    data = make_data([30, 20, 40, 30, 25, 35])
    priv = {"dp": "central", "noise_multiplier": 3.0, "delta": 1e-3, "target_epsilon": 3.0}
    changes = {"communication": {"upload_every": 2}, "evaluation": {"every": 100}, "rounds": 10}
    result = run(from_dict({**BASE, **changes, "privacy": priv}), data, store=False)
    acc = Accountant(3.0, 6, 3, 1e-3)  # a release a period: 1.7, 2.7, 3.6 after 1, 2, 3
    periods = max(t for t in range(6) if acc.epsilon(t) <= 3.0)
    assert len(result.rounds) == 2 * periods  # whole periods, no wasted local rounds
    assert [r.test_accuracy is not None for r in result.rounds][-1]
    assert "privacy budget: round 6 would take epsilon" in result.summary["privacy_stop"]


def test_the_privacy_table_holds_the_clip_norm_each_round_used(
    make_data: MakeData, one_thread: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adaptive clipping: the stored clip norm was read after the round had set
    the next one, a round ahead (round 0 showed round 1's)."""
    from fedforge.privacy.parts import PrivacyParts

    used: dict[int, float] = {}
    begin = PrivacyParts.begin_round

    def spy(self: PrivacyParts, state: dict[str, Any], round_idx: int) -> None:
        used[round_idx] = float(state["clip_norm"])
        begin(self, state, round_idx)

    monkeypatch.setattr(PrivacyParts, "begin_round", spy)
    data = make_data([30, 20, 40, 30, 25, 35])
    priv = {"dp": "central", "noise_multiplier": 0.5, "clip_norm": 0.3, "adaptive_clip": True,
            "clip_count_std": 1.0}  # fmt: skip
    result = run(from_dict({**BASE, "runs_dir": str(tmp_path), "privacy": priv}), data)
    with RunStore.open(result.run_dir or "") as store:
        stored = {r[0]: r[3] for r in store.privacy()}
    assert stored == used and stored[0] == 0.3 and len(set(stored.values())) == 3


@pytest.mark.parametrize(
    "priv",
    [
        {"dp": "central"},
        {"dp": "distributed", "secagg": True},
        {"secagg": True, "tiers": {"high_fraction": 0.5}},
    ],
    ids=["central", "distributed", "tiers"],
)
def test_secret_noise_reaches_every_mechanism(make_data: MakeData, priv: dict[str, Any]) -> None:
    """Two runs of the same config and seed: bit-identical with derived noise, not
    with secret noise (each mechanism draws from the OS)."""
    from tests.conftest import TINY_LOGREG

    data = make_data([30, 30, 30, 30], seed=1)
    noise = {"clip_norm": 0.5, "noise_multiplier": 1.0, **priv}
    for secret in (False, True):
        cfg = from_dict({**TINY_LOGREG, "privacy": {**noise, "secret_noise": secret}})
        a, b = (run(cfg, data, store=False).params for _ in range(2))
        assert torch.equal(a, b) != secret


def test_adaptive_clipping_counts_with_secret_noise(make_data: MakeData) -> None:
    """The clipped count's noise (Andrew et al.) is a release too: the next clip norm
    repeats with derived noise, not with secret noise."""
    from fedforge.server.experiment import build

    data = make_data([30, 30, 30, 30], seed=1)
    for secret in (False, True):
        priv = {"dp": "central", "adaptive_clip": True, "clip_count_std": 1.0,
                "secret_noise": secret}  # fmt: skip
        cfg = {"model": "logreg", "num_clients": 4, "dtype": "float64", "privacy": priv}
        exp = build(from_dict(cfg), data)
        assert exp.privacy is not None
        norms = []
        for _ in range(2):
            state: dict[str, Any] = {"clip_norm": 1.0}
            exp.privacy.end_round(state, 0, [0, 1])
            norms.append(state["clip_norm"])
        assert (norms[0] == norms[1]) != secret

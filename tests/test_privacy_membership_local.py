"""The loss-threshold membership-inference audit (its AUC and advantage on hand
examples) and local DP's noise calibrated to a per-upload epsilon (against the
exact Gaussian mechanism, Balle and Wang 2018, written out independently)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.test_privacy_dp import _gaussian_epsilon

from fedforge.config import from_dict
from fedforge.core.errors import ConfigError
from fedforge.evaluation.membership import best_advantage, loss_threshold_attack, roc_auc
from fedforge.pipeline.pipeline import StageContext
from fedforge.privacy.accountant import calibrate_local_noise, local_epsilon
from fedforge.privacy.dp import LocalNoise
from fedforge.privacy.parts import assemble
from fedforge.server.audit import audit_run
from fedforge.server.loop import run


def test_a_perfectly_separating_loss_gives_auc_one() -> None:
    audit = loss_threshold_attack([0.01, 0.02, 0.03], [0.5, 0.7, 0.9, 1.1])
    assert audit.auc == 1.0
    assert audit.advantage == 1.0
    assert (audit.members, audit.nonmembers) == (3, 4)
    assert audit.member_loss == pytest.approx(0.02)
    reversed_ = loss_threshold_attack([0.5, 0.7], [0.01, 0.02])
    assert reversed_.auc == 0.0


def test_identical_distributions_give_auc_one_half() -> None:
    same = np.array([0.3, 0.1, 0.7, 0.7])
    assert loss_threshold_attack(same, same).auc == 0.5
    rng = np.random.default_rng(0)
    audit = loss_threshold_attack(rng.exponential(size=20_000), rng.exponential(size=20_000))
    assert abs(audit.auc - 0.5) < 0.01  # 0.5 +- 0.0029 (one std) for 20,000 of each
    assert audit.advantage < 0.03


def test_auc_counts_ties_one_half_as_a_hand_example_and_pairwise_count() -> None:
    # pairs (pos > neg): 0.9 beats all 3; 0.4 beats 0.3, 0.1; 0.8 beats 0.3, 0.1 and
    # ties 0.8 (one half): 7.5 of 9
    assert roc_auc([0.9, 0.4, 0.8], [0.3, 0.8, 0.1]) == pytest.approx(7.5 / 9)
    rng = np.random.default_rng(1)
    pos, neg = rng.integers(0, 20, 300).astype(float), rng.integers(0, 25, 200).astype(float)
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert roc_auc(pos, neg) == pytest.approx(pairwise, abs=1e-12)
    # the best threshold on the score: t = 0.4 keeps all 3 members and 1 of 3 others
    # (0.8); t = 0.8 keeps 2 and 1; t = 0.9 keeps 1 and 0
    assert best_advantage([0.9, 0.4, 0.8], [0.3, 0.8, 0.1]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="NaN"):
        roc_auc([float("nan")], [0.1])


@pytest.mark.parametrize("epsilon", [10.0, 2.0, 1.0])
def test_local_noise_calibrated_to_a_round_epsilon_bounds_the_exact_gaussian(
    epsilon: float,
) -> None:
    """One upload is a Gaussian mechanism of std z C on an update clipped to C,
    whose replace-one sensitivity is 2C: its exact epsilon at std/sensitivity
    z / 2 must not pass the budget, and RDP's z is at most 15% above the exact
    one (found by bisection on the closed form)."""
    delta = 1e-5
    z = calibrate_local_noise(epsilon, delta)
    assert _gaussian_epsilon(z / 2, delta) <= epsilon
    assert local_epsilon(z, 1, delta) == pytest.approx(epsilon, rel=1e-3)
    lo, hi = 0.01, 100.0
    for _ in range(100):  # the exact z: its epsilon equals the budget
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _gaussian_epsilon(mid / 2, delta) > epsilon else (lo, mid)
    assert hi <= z <= 1.15 * hi


def test_round_epsilon_sets_the_local_noise_std() -> None:
    cfg = from_dict(
        {
            "num_clients": 10,
            "client_fraction": 0.5,
            "privacy": {"dp": "local", "clip_norm": 0.5, "round_epsilon": 2.0, "delta": 1e-5},
        }
    )
    parts = assemble(cfg, [20] * 10)
    noise = parts.client_stages[1]
    assert isinstance(noise, LocalNoise)
    z = calibrate_local_noise(2.0, 1e-5)
    assert noise.noise_multiplier == z
    drawn = noise.apply(torch.zeros(200_000, dtype=torch.float64), StageContext(0, 0, 3))
    assert float(drawn.std()) == pytest.approx(z * 0.5, rel=0.01)
    summary = parts.summary(4)
    assert summary["noise_multiplier"] == z
    assert summary["round_epsilon"] == 2.0
    # each client's epsilon: its uploads composed at the calibrated z
    uploads = max(summary["local_epsilon"].values())
    assert uploads >= 2.0 - 1e-9


def test_round_epsilon_needs_local_dp() -> None:
    with pytest.raises(ConfigError, match="privacy.round_epsilon"):
        from_dict({"num_clients": 10, "privacy": {"dp": "central", "round_epsilon": 2.0}})


def test_audit_membership_cli_on_a_stored_run(mnist_dir: Path, tmp_path: Path) -> None:
    """The command audits a finished run's final model: the attack's numbers on
    rows of its clients against test rows, as the API computes them; a model
    trained one round on 60,000 rows leaks nothing this attack sees."""
    cfg = from_dict(
        {
            "name": "mia-cli",
            "model": "2nn",
            "num_clients": 20,
            "client_fraction": 0.1,
            "rounds": 1,
            "local_epochs": 1,
            "batch_size": 50,
            "engine": "serial",
            "runs_dir": str(tmp_path / "runs"),
            "data_dir": str(mnist_dir),
        }
    )
    result = run(cfg)
    assert result.run_dir is not None
    env = {**os.environ, "FEDFORGE_DATA": str(mnist_dir)}
    cmd = [sys.executable, "-m", "fedforge.cli", "audit-membership", result.run_dir.name]
    where = ["--runs-dir", str(tmp_path / "runs"), "--examples", "400"]
    out = subprocess.run(cmd + where, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    expected = audit_run(result.run_dir, 400, 0)
    assert f"AUC {expected.auc:.4f}" in out.stdout
    assert "400 members" in out.stdout and "400 held-out" in out.stdout
    assert 0.4 < expected.auc < 0.6
    bad = subprocess.run(cmd + where[:2] + ["--examples", "0"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--examples 0 is invalid" in bad.stderr

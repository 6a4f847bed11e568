"""Privacy accounting with Google's ``dp-accounting`` (RDP: Mironov 2017; PLD:
Koskela et al. 2020, Doroshenko et al. 2022), not hand-written formulas.

A round of DP-FedAvg (McMahan et al. 2018) is one sampled Gaussian mechanism on
the clients: Poisson sampling at rate q (``PoissonSampledDpEvent``) or a fixed
cohort of m of N clients (``SampledWithoutReplacementDpEvent``, replace-one
neighbours, RDP only). T rounds compose the event T times. Local DP is a
Gaussian mechanism per participation of one client, without amplification (the
server sees that client's upload). Runs on the server; trusts the config.

dp-accounting's noise multiplier is the noise's std over the L2 sensitivity of
the released sum (its ``GaussianDpEvent``). A round adds std z C to a sum of
updates clipped to C. Under add-or-remove-one neighbours (Poisson sampling) one
client moves the sum by at most C: the multiplier is z. Under replace-one
neighbours (a fixed-size cohort; local DP, where any two inputs of a client are
neighbours) a clipped update u becomes another u', and ||u - u'|| <= 2 C: the
multiplier is z / 2 (:func:`accounted_multiplier`). Adaptive clipping's noised
count doubles its sensitivity the same way, so its combined z halves too.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fedforge.core.errors import ConfigError

if TYPE_CHECKING:
    import dp_accounting as dpa


@functools.cache
def _dpa() -> Any:
    """dp_accounting, imported on first use: it loads scipy (about 1.5 s), which a
    run without differential privacy should not pay at start-up."""
    import dp_accounting
    import dp_accounting.pld
    import dp_accounting.rdp

    return dp_accounting


AccountantKind = Literal["rdp", "pld"]
Sampling = Literal["fixed", "poisson"]

# dp-accounting's default orders (1.1 to 10.9 by 0.1, 11 to 63, 128 to 1024) and
# 1.75 and 80: a fine grid near 1 tightens small epsilons (a coarser grid gave 3.7%
# more at q = 0.3, z = 1, T = 3). Fixed-size sampling (replace-one) takes the
# integer orders only.
RDP_ORDERS = sorted(
    {1 + x / 10 for x in range(1, 100)} | {1.75, *range(11, 64), 80, 128, 256, 512, 1024}
)
RDP_INT_ORDERS = [o for o in RDP_ORDERS if float(o).is_integer()]

logging.getLogger("absl").setLevel(logging.ERROR)  # orders it excludes are not errors


def accounted_multiplier(noise_multiplier: float, replace_one: bool) -> float:
    """The noise multiplier dp-accounting takes for std z C added to a sum of
    updates clipped to C: z under add-or-remove-one, z / 2 under replace-one (the
    sum moves by up to 2 C)."""
    return noise_multiplier / 2 if replace_one else noise_multiplier


def round_event(
    noise_multiplier: float,
    sampling: Sampling,
    num_clients: int,
    cohort: int,
    rate: float | None = None,
) -> dpa.DpEvent:
    """The DP event of one round: the Gaussian mechanism on a sampled cohort, of
    m = ``cohort`` clients (fixed) or each client with probability ``rate``
    (Poisson; default m / N). The rate is the sampler's q = C itself: C N need
    not be whole (q = floor(C N) / N under-reported epsilon)."""
    gauss = _dpa().GaussianDpEvent(accounted_multiplier(noise_multiplier, sampling == "fixed"))
    if sampling == "poisson":
        q = cohort / num_clients if rate is None else rate
        return gauss if q >= 1 else _dpa().PoissonSampledDpEvent(q, gauss)
    if cohort >= num_clients:
        return gauss
    return _dpa().SampledWithoutReplacementDpEvent(num_clients, cohort, gauss)


def make_accountant(kind: AccountantKind, sampling: Sampling) -> dpa.PrivacyAccountant:
    """A fresh accountant of ``kind`` for events sampled by ``sampling``."""
    if kind == "pld":
        if sampling != "poisson":
            raise ConfigError(
                "privacy.accountant = 'pld' accounts Poisson sampling only; "
                "set privacy.sampling = 'poisson' or privacy.accountant = 'rdp'"
            )
        return _dpa().pld.PLDAccountant()
    if sampling == "fixed":
        return _dpa().rdp.RdpAccountant(RDP_INT_ORDERS, _dpa().NeighboringRelation.REPLACE_ONE)
    return _dpa().rdp.RdpAccountant(RDP_ORDERS)


@dataclass(frozen=True)
class Accountant:
    """epsilon(delta) of a run after any number of rounds (a pure function of
    the round count: every round is the same event)."""

    noise_multiplier: float
    num_clients: int
    cohort: int  # m (fixed) or the expected q N (Poisson)
    delta: float
    kind: AccountantKind = "rdp"
    sampling: Sampling = "fixed"
    rate: float | None = None  # Poisson: q (the client fraction); None: cohort / N

    def event(self, rounds: int) -> dpa.DpEvent:
        one = round_event(
            self.noise_multiplier, self.sampling, self.num_clients, self.cohort, self.rate
        )
        return _dpa().SelfComposedDpEvent(one, rounds)

    def epsilon(self, rounds: int) -> float:
        """epsilon after ``rounds`` rounds at the accountant's delta (0 before any)."""
        return _epsilon(self, rounds)


@functools.lru_cache(maxsize=4096)
def _epsilon(acc: Accountant, rounds: int) -> float:
    if rounds <= 0:
        return 0.0
    if acc.noise_multiplier <= 0:
        return math.inf
    if acc.kind == "rdp":  # RDP composes by addition: T rounds are T times one round
        orders, one = _rdp_of_one_round(acc)
        return float(_dpa().rdp.compute_epsilon(orders, rounds * one, acc.delta)[0])
    a = make_accountant(acc.kind, acc.sampling)
    a.compose(acc.event(rounds))
    return float(a.get_epsilon(acc.delta))


@functools.lru_cache(maxsize=64)
def _rdp_of_one_round(acc: Accountant) -> tuple[list[Any], Any]:
    """The orders and RDP vector of one round's event: computed once a run, so
    epsilon after every round costs a product, not a fresh subsampled-Gaussian
    bound (0.2 s a round for fixed-size cohorts). dp-accounting adds count * RDP
    for a self-composed event, so the result is the same to the last bit."""
    a = make_accountant("rdp", acc.sampling)
    a.compose(acc.event(1))
    return (RDP_INT_ORDERS if acc.sampling == "fixed" else RDP_ORDERS), a.rdp


def local_epsilon(
    noise_multiplier: float, participations: int, delta: float, kind: AccountantKind = "rdp"
) -> float:
    """epsilon of one client under local DP: its Gaussian mechanism composed once
    per upload (no amplification: the server sees whom it heard from)."""
    if participations <= 0:
        return 0.0
    a = make_accountant(kind, "poisson")  # no sampling event: any relation does
    a.compose(_dpa().GaussianDpEvent(accounted_multiplier(noise_multiplier, True)), participations)
    return float(a.get_epsilon(delta))


def calibrate_noise(
    epsilon: float,
    delta: float,
    rounds: int,
    sampling_rate: float,
    num_clients: int | None = None,
    kind: AccountantKind = "rdp",
    sampling: Sampling = "fixed",
) -> float:
    """The smallest noise multiplier whose ``rounds`` rounds at ``sampling_rate``
    spend at most ``epsilon`` at ``delta`` (bisection of dp-accounting).
    ``sampling`` as the run's ``privacy.sampling`` (default ``fixed``, as a run's:
    a cohort of max(1, floor(rate N)) of ``num_clients``, 10^6 if not given);
    ``poisson``: each client with probability ``sampling_rate``."""
    if not (epsilon > 0 and 0 < delta < 1 and rounds >= 1 and 0 < sampling_rate <= 1):
        raise ConfigError(
            f"calibrate_noise needs epsilon > 0, 0 < delta < 1, rounds >= 1 and a sampling "
            f"rate in (0, 1]; got {epsilon}, {delta}, {rounds}, {sampling_rate}"
        )
    from fedforge.selection.sampling import cohort_size

    n = num_clients if num_clients is not None else 10**6
    cohort = cohort_size(n, sampling_rate)  # what a run's fixed-size sampler takes

    def event(z: float) -> dpa.DpEvent:
        one = round_event(z, sampling, n, cohort, sampling_rate)
        return _dpa().SelfComposedDpEvent(one, rounds)

    return float(
        _dpa().calibrate_dp_mechanism(
            lambda: make_accountant(kind, sampling),
            event,
            epsilon,
            delta,
            _dpa().LowerEndpointAndGuess(1e-2, 1.0),
            tol=1e-4,
        )
    )


@functools.cache
def calibrate_local_noise(epsilon: float, delta: float, kind: AccountantKind = "rdp") -> float:
    """Local DP's noise multiplier for a per-upload budget: the smallest z whose
    one Gaussian release of a clipped update (std z C, replace-one sensitivity
    2 C) spends at most ``epsilon`` at ``delta``. The PLD accountant is tight for
    one Gaussian mechanism (it reproduces the analytic Gaussian mechanism of
    Balle and Wang 2018 to its discretisation); RDP gives a larger z."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ConfigError(
            f"calibrate_local_noise needs epsilon > 0 and 0 < delta < 1; got {epsilon}, {delta}"
        )

    def event(z: float) -> dpa.DpEvent:
        return _dpa().GaussianDpEvent(accounted_multiplier(z, True))

    return float(
        _dpa().calibrate_dp_mechanism(
            lambda: make_accountant(kind, "poisson"),
            event,
            epsilon,
            delta,
            _dpa().LowerEndpointAndGuess(0.05, 1.0),  # z below 0.05: epsilon past 100
            tol=1e-5,
        )
    )

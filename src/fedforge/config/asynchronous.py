"""The ``asynchronous:`` config section: synchronous rounds (the default) or
buffered asynchronous aggregation, FedBuff (Nguyen et al. 2022), of which
FedAsync (Xie et al. 2019) is the buffer of one update.

Under ``mode: fedbuff`` up to ``concurrency`` (M) clients train at once, each
from the model current when it was handed work; the server steps whenever
``buffer_size`` (K) updates arrived, each weighted by a function of its
staleness (the server steps since its model). ``server/buffered.py`` runs it on
the simulator's virtual clock; :func:`buffered_fits` says, in one line each,
what it does not compose with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_CLIENTS, MAX_ROUNDS
from fedforge.config.communication import CommunicationConfig
from fedforge.config.compat import cohort_size
from fedforge.config.evaluation import DiagnosticsConfig
from fedforge.config.local import StragglerConfig
from fedforge.config.privacy import PrivacyConfig
from fedforge.config.ranges import Most, Range
from fedforge.config.robust import RobustConfig
from fedforge.core.errors import ConfigError

AsyncMode = Literal["sync", "fedbuff"]
# constant: 1; polynomial: (1 + s)^-a; hinge: 1 up to b steps, then 1 / (a (s - b) + 1)
StalenessName = Literal["constant", "polynomial", "hinge"]
FEDBUFF = "fedbuff"


@dataclass(frozen=True)
class AsynchronousConfig:
    """How the server takes updates: a round's cohort at once, or a buffer of the
    updates that arrived, whatever model each was trained from."""

    mode: AsyncMode = "sync"  # sync: rounds of a cohort; fedbuff: buffered asynchronous
    # M: clients training at once; null: the cohort size, max(1, C N)
    concurrency: Annotated[
        int | None, Range(">= 1", null="the cohort size, max(1, C N)"), Most(MAX_CLIENTS, "clients")
    ] = None
    # K: updates a server step takes (1: FedAsync); null: the concurrency M
    buffer_size: Annotated[
        int | None, Range(">= 1", null="the concurrency M"), Most(MAX_CLIENTS, "updates")
    ] = None
    staleness: StalenessName = "polynomial"
    # polynomial: a in (1 + s)^-a (0.5: the papers' 1 / sqrt(1 + s)); hinge: the slope a
    staleness_exponent: Annotated[float, Range(">= 0", note="a of (1 + s)^-a")] = 0.5
    hinge_slope: Annotated[float, Range(">= 0", note="a of 1 / (a (s - b) + 1)")] = 10.0
    hinge_after: Annotated[
        int, Range(">= 0", note="b: steps of staleness weighted 1"), Most(MAX_ROUNDS, "rounds")
    ] = 4
    # an update more server steps stale than this is refused; null: any staleness
    max_staleness: Annotated[
        int | None, Range(">= 0", null="no bound"), Most(MAX_ROUNDS, "rounds")
    ] = None

    @property
    def buffered(self) -> bool:
        return self.mode == FEDBUFF

    def check(self) -> None:
        m, k = self.concurrency, self.buffer_size
        if m is not None and k is not None and k > m:
            raise ConfigError(
                f"asynchronous.buffer_size = {k} is larger than asynchronous.concurrency = "
                f"{m}: a step takes at most the updates of the clients training at once"
            )

    def concurrency_of(self, num_clients: int, client_fraction: float) -> int:
        """M: the clients training at once under ``fedbuff``."""
        m = self.concurrency
        return m if m is not None else cohort_size(num_clients, client_fraction)

    def buffer_size_of(self, num_clients: int, client_fraction: float) -> int:
        """K: the updates one server step takes under ``fedbuff``."""
        k = self.buffer_size
        return k if k is not None else self.concurrency_of(num_clients, client_fraction)


def buffered_fits(
    asyn: AsynchronousConfig,
    num_clients: int,
    client_fraction: float,
    algorithm: str,
    privacy: PrivacyConfig,
    robust: RobustConfig,
    communication: CommunicationConfig,
    stragglers: StragglerConfig,
    diagnostics: DiagnosticsConfig,
) -> None:
    """What buffered asynchronous aggregation does not compose with, refused in
    one line each (the rest of the config runs as in synchronous rounds)."""
    if not asyn.buffered:
        return
    said = "asynchronous.mode = 'fedbuff'"
    m = asyn.concurrency_of(num_clients, client_fraction)
    k = asyn.buffer_size_of(num_clients, client_fraction)
    if m > num_clients:
        raise ConfigError(f"asynchronous.concurrency = {m} is more than the {num_clients} clients")
    if k > m:
        raise ConfigError(
            f"asynchronous.buffer_size = {k} is larger than the concurrency M = {m}: a step "
            "takes at most the updates of the clients training at once"
        )
    refusals = [
        (
            privacy.dp != "none" or privacy.tiers.enabled or privacy.sampling == "poisson",
            "differential privacy: its accountant bounds uniform (or Poisson) samples of "
            "rate C, and clients handed work as slots free up are neither; set privacy.dp "
            "to 'none'",
        ),
        (
            privacy.secagg,
            "privacy.secagg: its masks cancel only within a cohort that agreed its keys "
            "together, which a buffer of updates from different moments is not",
        ),
        (
            robust.aggregator != "mean",
            f"robust.aggregator = '{robust.aggregator}': a robust rule compares updates "
            "trained from one model, and a buffer's come from several (their staleness "
            "differs as well as their honesty); use 'mean' (the norm bounds still apply)",
        ),
        (
            algorithm == "scaffold",
            "algorithm 'scaffold': its control variates assume each update was trained "
            "against the server's current control",
        ),
        (
            communication.groups > 0,
            "communication.groups: edge means gather a synchronous cohort",
        ),
        (
            communication.upload_every > 1,
            f"communication.upload_every = {communication.upload_every}: upload "
            "periods are rounds of a synchronous cohort",
        ),
        (
            stragglers.fraction > 0,
            "stragglers.fraction > 0: slow clients are the profiles' (systems.profiles), "
            "on the virtual clock",
        ),
        (
            diagnostics.loss_gap,
            "diagnostics.loss_gap: it scores the model a cohort starts from, and a "
            "buffer's clients started from different ones",
        ),
    ]
    for refused, why in refusals:
        if refused:
            raise ConfigError(f"{said} with {why}")

"""The ``proxy:`` config section: a small public labelled set the server holds
against label skew (Zhao et al. 2018, "Federated Learning with Non-IID Data":
a globally shared subset), carved from the training rows no client then holds
(``server/proxy.py``). Two uses, each off by default: a few epochs of SGD on it
after each server step (``tune_epochs``), and its rows of the classes a client
lacks added to that client's data (``fill_missing``, opt-in, the bytes shipped
counted once per client in the run's downlink).

What composes with privacy (:func:`proxy_fits`): tuning is post-processing of
the released model with public data, so it leaves any DP guarantee and what
secure aggregation hides as they were. Filling reads each client's label
histogram, a release about the client that neither the DP accountant nor secure
aggregation covers: refused with either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fedforge.config.asynchronous import AsynchronousConfig
from fedforge.config.bounds import MAX_EXAMPLES, MAX_STEPS
from fedforge.config.deployment import DeploymentConfig
from fedforge.config.privacy import PrivacyConfig
from fedforge.config.ranges import Most, Range
from fedforge.core.errors import ConfigError, invalid_field


@dataclass(frozen=True)
class ProxyConfig:
    """The server's proxy set and its two uses."""

    # rows carved from the training set, class-balanced (each class size // C, the
    # first size % C classes one more); 0: no proxy set
    size: Annotated[int, Range(">= 0", note="0: none"), Most(MAX_EXAMPLES, "examples")] = 0
    # passes of SGD over the proxy set after each server step; 0: no tuning
    tune_epochs: Annotated[int, Range(">= 0", note="0: off"), Most(MAX_STEPS, "epochs")] = 0
    tune_lr: Annotated[float, Range("(0, 10]")] = 0.01
    # the tuning's minibatch; null: the whole proxy set, one step an epoch
    tune_batch_size: Annotated[
        int | None, Range(">= 1", null="the whole proxy set"), Most(MAX_EXAMPLES, "examples")
    ] = 32
    # a client whose label histogram lacks classes trains on the proxy's rows of them too
    fill_missing: bool = False
    # rows of each missing class a client gets; 0: all the proxy's rows of that class
    fill_per_class: Annotated[
        int, Range(">= 0", note="0: all of the class"), Most(MAX_EXAMPLES, "examples")
    ] = 0

    @property
    def tunes(self) -> bool:
        return self.size > 0 and self.tune_epochs > 0

    @property
    def fills(self) -> bool:
        return self.size > 0 and self.fill_missing

    def check(self) -> None:  # a use without a set: after every field's bounds
        return None


def proxy_fits(
    proxy: ProxyConfig,
    privacy: PrivacyConfig,
    deployment: DeploymentConfig,
    asynchronous: AsynchronousConfig,
) -> None:
    """The proxy set's uses with its size, and with the run's privacy, deployment
    and rounds, in one line each."""
    if (proxy.tune_epochs > 0 or proxy.fill_missing) and proxy.size == 0:
        what = "tune_epochs > 0" if proxy.tune_epochs > 0 else "fill_missing"
        raise invalid_field("proxy.size", proxy.size, f"must be >= 1 with proxy.{what}")
    if proxy.size > 0 and deployment.client_data == "remote":
        raise ConfigError(
            "proxy.size > 0 with deployment.client_data = 'remote': the server holds no "
            "training rows to carve the proxy set from; use client_data = 'partition'"
        )
    if not proxy.fills:
        return
    hidden = None
    if privacy.dp != "none":
        hidden = f"privacy.dp = '{privacy.dp}' (its accountant does not count that release)"
    elif privacy.tiers.enabled:
        hidden = "privacy tiers (their accounting does not count that release)"
    elif privacy.secagg:
        hidden = "privacy.secagg (the server would learn what it hides of each client)"
    if hidden is not None:
        raise ConfigError(
            f"proxy.fill_missing with {hidden}: filling reads each client's label "
            "histogram; use proxy.tune_epochs alone (tuning on public data is post-processing)"
        )
    if asynchronous.buffered:
        raise ConfigError(
            "proxy.fill_missing with asynchronous.mode = 'fedbuff': its shipped rows are "
            "counted in synchronous rounds; use mode = 'sync'"
        )
